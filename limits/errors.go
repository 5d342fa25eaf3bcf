package limits

import (
	"errors"
	"net/http"
	"strconv"
	"time"
)

// codeResourceExhausted is the status code name of a budget error.
const codeResourceExhausted = "resource_exhausted"

// ErrResourceExhausted is matched (errors.Is) by every *ExhaustedError: a Grow
// refused by an account, its pool, or the Go heap (see
// PoolConfig.HeapPressure). It is also the cause (context.Cause) of a context
// the heap watch canceled.
var ErrResourceExhausted = errors.New("limits: " + codeResourceExhausted)

// ErrInvalidSize is matched (errors.Is) by the error of a Grow, Resize or Open
// given a negative size or a limit ≤ 0, of a negative PoolConfig.Limit, and of
// an HTTPConfig or WorkConfig Limit ≤ 0: a caller bug, not matching
// ErrResourceExhausted. A size too large, however large, is resource_exhausted.
var ErrInvalidSize = errors.New("limits: invalid size")

// ErrClosed is matched (errors.Is) by the error of a Grow or Open on a closed
// account or pool, or on any account below a closed account or of a closed
// pool. When the account was closed because its WithAccount context ended, the
// error also wraps that context's cause: ErrResourceExhausted after a
// heap-pressure cancel, context.Canceled after a client disconnect.
var ErrClosed = errors.New("limits: closed")

// ExhaustedError is the error of a refused Grow; it matches
// ErrResourceExhausted. Its fields describe the scope that refused.
type ExhaustedError struct {
	// Requested is the size the refused call asked for, in bytes, as passed to
	// Grow; for a heap-watch cancel's cause, what the account used.
	Requested int64
	// Used is the bytes in use in Scope when the call was refused (for heap
	// pressure, the live heap at the last GC).
	Used int64
	// Limit is the bytes Scope allows (for heap pressure, the threshold).
	Limit int64
	// Scope is the name path of what refused, from the pool down
	// ("pool/req-17", "pool"), followed by " (heap pressure)" when the live
	// heap was over the pool's threshold.
	Scope string
	// RetryAfter is WriteError's Retry-After: 1 s when the pool was full or
	// under heap pressure; 0 when a retry cannot succeed (over the request's
	// own budget, or the pool's limit).
	RetryAfter time.Duration
}

// Error returns a message such as
// "limits: resource_exhausted in pool/req-17: requested 1048576 bytes, 66060288 in use, limit 67108864".
func (e *ExhaustedError) Error() string {
	b := make([]byte, 0, 128)
	b = append(b, "limits: "+codeResourceExhausted+" in "...)
	b = append(b, e.Scope...)
	b = append(b, ": requested "...)
	b = strconv.AppendInt(b, e.Requested, 10)
	b = append(b, " bytes, "...)
	b = strconv.AppendInt(b, e.Used, 10)
	b = append(b, " in use, limit "...)
	b = strconv.AppendInt(b, e.Limit, 10)
	return string(b)
}

// Is reports whether target is ErrResourceExhausted.
func (e *ExhaustedError) Is(target error) bool { return target == ErrResourceExhausted }

// Code returns "resource_exhausted", the code name of a budget error: gRPC's
// code 8 RESOURCE_EXHAUSTED, HTTP 429 in Connect and Twirp (HTTPStatus).
func (e *ExhaustedError) Code() string { return codeResourceExhausted }

// HTTPStatus returns 429, http.StatusTooManyRequests.
func (e *ExhaustedError) HTTPStatus() int { return http.StatusTooManyRequests }
