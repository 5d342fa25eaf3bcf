//go:build !linux

package fastread

import "errors"

func openat([]byte) (int, error) { return -1, errors.ErrUnsupported }
