package limits

import (
	"bufio"
	"io"
	"math"
	"net"
	"net/http"
	"sync/atomic"
)

// bodyCopies is how many times its length a request body is charged: read
// into memory it is held twice at its peak (docs/budgets.md).
const bodyCopies = 2

// bodyCharge returns bodyCopies × n, saturated at math.MaxInt64.
func bodyCharge(n int64) int64 {
	if n > math.MaxInt64/bodyCopies {
		return math.MaxInt64
	}
	return n * bodyCopies
}

// chargedBody is a body of unknown length charged as it is read; after a
// refusal every Read returns the budget error (docs/budgets.md).
type chargedBody struct {
	rc      io.ReadCloser
	a       *Account
	charged atomic.Int64
	err     error // the first refusal, returned by every later Read
}

func (b *chargedBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.rc.Read(p)
	if n > 0 {
		c := bodyCharge(int64(n))
		if gerr := b.a.Grow(c); gerr != nil {
			b.err = gerr
			return 0, gerr
		}
		b.charged.Add(c)
	}
	return n, err
}

func (b *chargedBody) Close() error { return b.rc.Close() }

// writeTracker records whether the handler has answered, so that a refused
// read gets the middleware's 429 only when it wrote nothing.
type writeTracker struct {
	http.ResponseWriter
	wrote bool
}

func (w *writeTracker) WriteHeader(code int) {
	if code >= 200 || code == http.StatusSwitchingProtocols { // 1xx is not the answer, but 101 is
		w.wrote = true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *writeTracker) Write(p []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(p)
}

// Flush sends what was written, and the headers: the answer has begun.
func (w *writeTracker) Flush() {
	w.wrote = true
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *writeTracker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	w.wrote = true
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

// ReadFrom keeps net/http's sendfile path for io.Copy(w, file).
func (w *writeTracker) ReadFrom(r io.Reader) (int64, error) {
	w.wrote = true
	if rf, ok := w.ResponseWriter.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{w.ResponseWriter}, r)
}

func (w *writeTracker) Unwrap() http.ResponseWriter { return w.ResponseWriter }
