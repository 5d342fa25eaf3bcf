//go:build !linux

package main

import "github.com/memctl/memctl/internal/childtest"

// The state record children run on Linux only (status_record_linux_test.go).
func serviceChild() { childtest.Fail("the service child is Linux only") }
func forgeChild()   { childtest.Fail("the forge child is Linux only") }
func chrootChild()  { childtest.Fail("the chroot child is Linux only") }
