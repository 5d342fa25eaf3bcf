//go:build !unix

package main

import "github.com/memctl/memctl/internal/childtest"

// stallChild needs mmap: Unix only (its test skips elsewhere).
func stallChild() { childtest.Fail("stallChild: Unix only") }
