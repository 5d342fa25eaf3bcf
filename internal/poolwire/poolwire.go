// Package poolwire hands the facade the open pools of package limits
// without a public listing. Package limits sets Pools in its init; any
// avoids an import cycle.
package poolwire

// Pools returns the open pools (made by limits.NewPool, not closed nor
// dropped), oldest first, each a *limits.Pool. Safe for concurrent use.
var Pools func() []any
