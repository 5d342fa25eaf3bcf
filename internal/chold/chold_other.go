//go:build !linux || !cgo

package chold

import (
	"errors"
	"fmt"
)

var errUnsupported = fmt.Errorf("chold: needs cgo on Linux: %w", errors.ErrUnsupported)

// Hold returns an error matching errors.ErrUnsupported.
func Hold(bytes int64) error { return errUnsupported }

// Release returns an error matching errors.ErrUnsupported.
func Release() error { return errUnsupported }
