// Package examplestore is the work behind memctl.example.Store, the service
// of the grpcbudget and connectbudget example servers (one service, two
// transports). Each method charges the call's budget (limits.Grow) before
// it builds anything.
package examplestore

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/memctl/memctl/limits"
)

// ServiceName is the Store service's full name.
const ServiceName = "memctl.example.Store"

// Alloc charges n bytes to the call's budget, builds them (touching every
// page) and returns n; a refused Grow's error is returned as is.
func Alloc(ctx context.Context, n int64) (int64, error) {
	if err := limits.Grow(ctx, n); err != nil {
		return 0, err
	}
	defer limits.Shrink(ctx, n)
	b := make([]byte, n)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	return int64(len(b)), nil
}

// AllocWrapped is Alloc with its error wrapped with %w.
func AllocWrapped(ctx context.Context, n int64) (int64, error) {
	if _, err := Alloc(ctx, n); err != nil {
		return 0, fmt.Errorf("store: alloc %d bytes: %w", n, err)
	}
	return n, nil
}

// AllocUndercharged charges a 32 MiB guess, then builds n bytes in 8 MiB
// steps: a handler whose real size only the heap watch sees. When the heap
// watch cancels it, it returns ctx.Err(), as most handlers do.
func AllocUndercharged(ctx context.Context, n int64) (int64, error) {
	const guess, step = 32 << 20, 8 << 20
	if err := limits.Grow(ctx, guess); err != nil {
		return 0, err
	}
	defer limits.Shrink(ctx, guess)
	var steps [][]byte
	for built := int64(0); built < n; built += step {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		b := make([]byte, step)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1 // touch every page, as real work would
		}
		steps = append(steps, b)
	}
	return int64(len(steps)) * step, nil
}

// Hold charges n bytes and holds them until the caller cancels.
func Hold(ctx context.Context, n int64) (int64, error) {
	if err := limits.Grow(ctx, n); err != nil {
		return 0, err
	}
	defer limits.Shrink(ctx, n)
	<-ctx.Done()
	return n, ctx.Err()
}

// Wait returns after ms milliseconds (a decimal string; no wait unless it
// is a positive number), or once ctx ends.
func Wait(ctx context.Context, ms string) {
	if n, err := strconv.Atoi(ms); err == nil && n > 0 {
		select {
		case <-time.After(time.Duration(n) * time.Millisecond):
		case <-ctx.Done():
		}
	}
}
