package limits

import (
	"errors"
	"net/http"
	"strconv"
	"time"
)

// CodeResourceExhausted is the status code name of a budget error, for
// servers that map errors to their protocol: gRPC's code 8
// RESOURCE_EXHAUSTED, which Connect and Twirp map to HTTP 429 Too Many
// Requests (ExhaustedError.HTTPStatus).
const CodeResourceExhausted = "resource_exhausted"

// ErrResourceExhausted is matched (with errors.Is) by every *ExhaustedError:
// a Grow refused because an account, its pool, or the Go heap (see
// PoolConfig.HeapPressure) had no room for it. It is also the cause
// (context.Cause) of a context canceled by the heap watch.
var ErrResourceExhausted = errors.New("limits: " + CodeResourceExhausted)

// ErrInvalidSize is matched (with errors.Is) by the error of a Grow, Resize
// or Open given a negative size or limit, of an Open with limit 0 (no limit
// is asked for by name, Unlimited), and of a negative PoolConfig.Limit or
// HTTPConfig.Limit, or an HTTPConfig.Limit of 0. It is a caller bug, not a
// lack of memory, so it does not match ErrResourceExhausted. A size too
// large for a limit is never an invalid size, however large: it is
// resource_exhausted (a handler passes client-supplied sizes such as
// Content-Length).
var ErrInvalidSize = errors.New("limits: invalid size")

// ErrClosed is matched (with errors.Is) by the error of a Grow or Open on a
// closed account or pool, or on an account opened (at any depth) from a
// closed account, or an account of a closed pool. When the
// account was closed because the context it was bound to with WithAccount
// ended, the error also wraps that context's cause: it then matches
// ErrResourceExhausted as well after a heap-pressure cancel, or
// context.Canceled after a client disconnect.
var ErrClosed = errors.New("limits: closed")

// ExhaustedError is the error of a refused Grow. It matches
// ErrResourceExhausted with errors.Is. Its fields describe the scope that
// refused, which is the account itself, one of its ancestors, or the pool.
type ExhaustedError struct {
	// Requested is the size the refused call asked for, in bytes, exactly as
	// passed to Grow (or the growth a Resize asked for); never rounded to
	// chunks. In the cause of a context canceled by the heap watch
	// (PoolConfig.CancelLargest) it is what the canceled account used.
	Requested int64
	// Used is the bytes in use in Scope when the call was refused. For an
	// account it is Used(); for a pool it is the bytes its accounts hold
	// (Pool.Used, which includes up to two chunks per account not yet used).
	// For heap pressure it is the live Go heap after the last GC cycle.
	Used int64
	// Limit is the bytes Scope allows. For heap pressure it is the
	// threshold, PoolConfig.HeapPressure times GOMEMLIMIT.
	Limit int64
	// Scope is the name path of what refused, from the pool down, for
	// example "pool/req-17/sort" for an account or "pool" for the pool. It
	// ends with " (heap pressure)" when the live Go heap was over the
	// pool's threshold: "pool (heap pressure)" for a refused Grow, and the
	// account's path, as in "pool/req-17 (heap pressure)", in the cause of a
	// context the heap watch canceled.
	Scope string
	// RetryAfter is how long a client should wait before it retries, when a
	// retry can succeed: 1 s when the pool was full or
	// under heap pressure, as other requests end and the collector runs; 0
	// when the request was over its own budget or an ancestor account's, or
	// when what the account uses plus the refused size is more than the
	// pool's whole limit: a retry of the same request meets them again. WriteError sends it as
	// Retry-After.
	RetryAfter time.Duration
}

// Error returns a message such as
// "limits: resource_exhausted in pool/req-17: requested 1048576 bytes, 66060288 in use, limit 67108864".
func (e *ExhaustedError) Error() string {
	b := make([]byte, 0, 128)
	b = append(b, "limits: "+CodeResourceExhausted+" in "...)
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

// Code returns CodeResourceExhausted, "resource_exhausted".
func (e *ExhaustedError) Code() string { return CodeResourceExhausted }

// HTTPStatus returns 429, http.StatusTooManyRequests.
func (e *ExhaustedError) HTTPStatus() int { return http.StatusTooManyRequests }
