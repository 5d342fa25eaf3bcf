// Package poolwire hands the facade the open budget pools of package limits
// (for the state record) without a public listing. Package limits sets
// Pools in its init; any is used where naming limits.Pool would be an import
// cycle.
package poolwire

// Pools returns the open pools (made by limits.NewPool, not closed nor
// dropped), oldest first, each a *limits.Pool. Safe for concurrent use.
var Pools func() []any
