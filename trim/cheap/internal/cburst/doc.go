// Package cburst makes C heap bursts for the tests of package cheap: C
// threads (pthreads) that allocate many small blocks with malloc and free
// them, all or all but every k-th, so that a test can read back what the
// allocator owning malloc keeps resident and what a release returns.
//
// It is test support, not API. The working code needs cgo on Linux; in other
// builds the package is empty.
package cburst
