// Package realsvc runs real public Go services with memctl added as the
// README tells a user, each beside the same service without memctl at the
// same time, in real memory cgroups of this machine (issue 36): etcd
// (go.etcd.io/etcd/server/v3) with a 600-700 MiB bbolt database, and
// Prometheus Pushgateway with small pushes, a 15 MiB push and its delete,
// and an oversized push.
//
// The package's one test is the entry point; the README gives the command
// that runs it (MEMCTL_REALSVC=1 turns it on).
//
// The services are fetched through the Go module proxy at pinned versions
// (the nearest served patch version when a pinned one is not served, said
// in a log line; REALSVC_ETCD and REALSVC_PUSHGATEWAY pin others), copied into a cache directory (REALSVC_CACHE, default
// $TMPDIR/realsvc-cache), and built there against this checkout with a
// replace line: the plain service from its own main package, the memctl
// variants with one added file each (files under testdata/, chosen with a
// build tag, so that the plain build compiles exactly the service's own
// code). Builds are cached under a key made of the versions, the Go
// version, the added files and a hash of the checkout's Go files that the
// builds compile. The package is test infrastructure: its code is in its
// test files, and nothing in the library imports it.
package realsvc
