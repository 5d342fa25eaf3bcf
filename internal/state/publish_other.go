//go:build !linux

package state

import (
	"errors"
	"fmt"
	"runtime"
)

// Publish returns an error matching errors.ErrUnsupported off Linux: there
// is no memfd to publish in. The /debug/memctl handler still works.
func Publish(r *Record) error {
	return fmt.Errorf("state: the record is Linux only, not %s: %w", runtime.GOOS, errors.ErrUnsupported)
}
