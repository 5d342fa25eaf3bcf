//go:build !linux

package main

import "github.com/memctl/memctl/internal/childtest"

// The state record children run on Linux only (status_record_linux_test.go).
func serviceChild()   { childtest.Fail("the service child is Linux only") }
func forgeChild()     { childtest.Fail("the forge child is Linux only") }
func chrootChild()    { childtest.Fail("the chroot child is Linux only") }
func republishChild() { childtest.Fail("the republish child is Linux only") }
func rewriteChild()   { childtest.Fail("the rewrite child is Linux only") }
func fdsChild()       { childtest.Fail("the fds child is Linux only") }
func pidReuseChild()  { childtest.Fail("the pidreuse child is Linux only") }
