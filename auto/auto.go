// Package auto runs memctl.Start with its defaults when it is imported for
// its side effect:
//
//	import _ "github.com/memctl/memctl/auto"
//
// The environment variables listed in package memctl still apply
// (MEMCTL=off turns everything off). The controller lives as long as the
// process; the package-level memctl.AfterBurst and memctl.Begin use it.
// Errors from Start are logged by Start through slog.Default and do not stop
// the program.
package auto

import "github.com/memctl/memctl"

func init() {
	_, _ = memctl.Start()
}
