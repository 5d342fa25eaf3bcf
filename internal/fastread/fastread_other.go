//go:build !linux

package fastread

import "errors"

func read(Path, []byte, int) ([]byte, error) { return nil, errors.ErrUnsupported }
