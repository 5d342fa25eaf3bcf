// Package limits keeps a Go process inside its memory limit.
//
// # GOMEMLIMIT from the cgroup
//
// SetGoMemLimit sets GOMEMLIMIT to a share (default 0.9) of the cgroup
// memory limit, found by github.com/KimMachineGun/automemlimit: cgroup v1
// (memory.limit_in_bytes and the hierarchy's tightest limit) or cgroup v2
// (memory.max of the cgroup and its ancestors). Without GOMEMLIMIT the Go
// garbage collector does not know the container's limit, lets the heap grow to
// twice the live heap (GOGC=100) and a burst ends in an OOM kill; with it, the
// collector works harder as the heap nears the limit. The operator wins: a
// GOMEMLIMIT in the environment, or AUTOMEMLIMIT=off, is never overridden,
// and a numeric AUTOMEMLIMIT is the ratio. It returns a MemLimit that says
// what was decided and why.
package limits
