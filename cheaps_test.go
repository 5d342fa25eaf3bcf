package memctl

// extraChildren are child processes registered by test files that build
// only in some configurations (cgo on Linux), added to TestMain's.
var extraChildren = map[string]func(){}
