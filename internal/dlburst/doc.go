// Package dlburst makes a C heap burst through an allocator that a test
// dlopens itself (with RTLD_LOCAL or RTLD_GLOBAL), so that its memory never
// passes through the process's malloc: the case of a library or plugin
// that carries its own allocator.
//
// It is test support, not API. The working code needs cgo on Linux; in other
// builds the package is empty.
package dlburst
