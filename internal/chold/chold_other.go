//go:build !linux || !cgo

package chold

import (
	"errors"
	"fmt"
)

var errUnsupported = fmt.Errorf("chold: needs cgo on Linux: %w", errors.ErrUnsupported)

// Hold returns an error matching errors.ErrUnsupported without cgo or off
// Linux.
func Hold(bytes int64) error { return errUnsupported }

// Release returns an error matching errors.ErrUnsupported without cgo or
// off Linux.
func Release() error { return errUnsupported }
