package limits

import (
	"errors"
	"net/http"
	"strconv"
	"time"
)

// codeResourceExhausted is the status code name of a budget error.
const codeResourceExhausted = "resource_exhausted"

// ErrResourceExhausted is matched (errors.Is) by every *ExhaustedError, and is
// the cause (context.Cause) of a context the heap watch canceled.
var ErrResourceExhausted = errors.New("limits: " + codeResourceExhausted)

// ErrInvalidSize is matched (errors.Is) by the error of a negative size, or a
// limit ≤ 0 where one is required: a caller bug. A size too large, however
// large, is resource_exhausted.
var ErrInvalidSize = errors.New("limits: invalid size")

// ErrClosed is matched (errors.Is) by the error of a Grow or Open on a closed
// account or pool, or below one. When the account was closed because its
// WithAccount context ended, the error also wraps that context's cause.
var ErrClosed = errors.New("limits: closed")

// ExhaustedError is the error of a refused Grow; it matches
// ErrResourceExhausted. Its fields, in bytes, describe the scope that refused
// (for heap pressure: the live heap and the threshold).
type ExhaustedError struct {
	// Requested is what the refused Grow asked for; for a heap-watch cancel's
	// cause, what the account used.
	Requested int64
	Used      int64 // in use in Scope
	Limit     int64 // what Scope allows
	// Scope is the name path of what refused ("pool/req-17", "pool"),
	// followed by " (heap pressure)" or " (shedding)" when those refused.
	Scope string
	// RetryAfter is WriteError's Retry-After: 1 s when the pool was full,
	// under heap pressure or shedding; 0 when a retry cannot succeed.
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

// Code returns "resource_exhausted": gRPC's code 8, HTTP 429 (HTTPStatus).
func (e *ExhaustedError) Code() string { return codeResourceExhausted }

// HTTPStatus returns 429, http.StatusTooManyRequests.
func (e *ExhaustedError) HTTPStatus() int { return http.StatusTooManyRequests }
