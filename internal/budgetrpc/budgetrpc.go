// Package budgetrpc is the part of grpcbudget and connectbudget that does
// not depend on the RPC framework: each call's limits.WorkConfig, the retry
// pushback of a budget error, and running a handler under its work.
package budgetrpc

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/memctl/memctl/limits"
)

// The retry pushback of gRFC A6: its trailer or metadata key (a value in
// milliseconds), and its value when a retry cannot succeed.
const (
	PushbackKey     = "grpc-retry-pushback-ms"
	NoRetryPushback = "-1"
)

// Config is the part of the adapters' Config that sets each call's work.
type Config struct {
	Limit          int64                      // each call's budget in bytes
	Name           func(method string) string // nil: "req-N"
	BurstThreshold int64                      // as limits.WorkConfig
	AfterBurst     func()                     // as limits.WorkConfig
}

// Check returns an error matching limits.ErrInvalidSize, prefixed with
// pkg, for a Limit of 0 or less.
func (c Config) Check(pkg string) error {
	if c.Limit <= 0 {
		return fmt.Errorf("%s: %w: Config.Limit %d: pass a limit in bytes, or limits.Unlimited for calls limited by the pool alone", pkg, limits.ErrInvalidSize, c.Limit)
	}
	return nil
}

// Work returns the WorkConfig of a call of method ("/package.Service/Method").
func (c Config) Work(method string) limits.WorkConfig {
	w := limits.WorkConfig{Limit: c.Limit, BurstThreshold: c.BurstThreshold, AfterBurst: c.AfterBurst}
	if c.Name != nil {
		w.Name = c.Name(method)
	}
	return w
}

// Pushback returns the retry values of err's *limits.ExhaustedError:
// pushback in milliseconds (NoRetryPushback when RetryAfter is 0) and
// retryAfter in whole seconds ("" when RetryAfter is 0), both rounded up.
// Both are "" when err carries no *limits.ExhaustedError.
func Pushback(err error) (pushback, retryAfter string) {
	e, ok := errors.AsType[*limits.ExhaustedError](err)
	switch {
	case !ok:
		return "", ""
	case e.RetryAfter <= 0:
		return NoRetryPushback, ""
	}
	return strconv.FormatInt(int64((e.RetryAfter+time.Millisecond-1)/time.Millisecond), 10),
		strconv.FormatInt(int64((e.RetryAfter+time.Second-1)/time.Second), 10)
}

// Run runs handler, then release, then ends w with the handler's error: err
// is the handler's, ferr Finish's. If the handler panics, release runs, w is
// abandoned and the panic goes on.
func Run(w *limits.Work, release func(), handler func() error) (err, ferr error) {
	returned := false
	defer func() {
		if !returned {
			release()
			w.Abandon()
		}
	}()
	err = handler()
	returned = true
	release()
	return err, w.Finish(err)
}

// Charge is the charge on A of the message a call received last. It is not
// safe for concurrent use.
type Charge struct {
	A    *limits.Account
	held int64 // bytes
}

// Receive releases the previous message's charge, then charges n bytes and
// calls unmarshal if A grants them. refused is Grow's error (unmarshal is
// not called); err is unmarshal's (the n bytes are released).
func (c *Charge) Receive(n int64, unmarshal func() error) (refused, err error) {
	c.Release()
	if err := c.A.Grow(n); err != nil {
		return err, nil
	}
	if err := unmarshal(); err != nil {
		c.A.Shrink(n)
		return nil, err
	}
	c.held = n
	return nil, nil
}

// Release returns the held charge to A.
func (c *Charge) Release() {
	c.A.Shrink(c.held)
	c.held = 0
}
