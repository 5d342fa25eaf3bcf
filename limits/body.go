package limits

import (
	"bufio"
	"io"
	"math"
	"net"
	"net/http"
	"sync/atomic"
)

// bodyCopies is how many times its length a request body is charged: a
// body read into memory is held twice at its peak. io.ReadAll builds it in
// chunks and copies them into one slice at the end, also when a Read
// fails; bytes.Buffer and encoding/json's Decoder copy their buffer into
// one twice as large as they grow. A body charged once could therefore
// hold twice its budget in memory before the charge refused it (measured
// figures: docs/budgets.md).
const bodyCopies = 2

// bodyCharge returns what a body of n bytes is charged, bodyCopies times n,
// or math.MaxInt64 when that does not fit (a Content-Length from a client
// can be any size).
func bodyCharge(n int64) int64 {
	if n > math.MaxInt64/bodyCopies {
		return math.MaxInt64
	}
	return n * bodyCopies
}

// chargedBody is a request body of unknown length (chunked, or HTTP/2
// without content-length) whose reads are charged to the request's
// account as they happen: bodyCharge of each Read's bytes. When the
// account refuses, that Read and every later one returns the budget error
// and the bytes it read are dropped. Reads and Close come from the handler;
// charged is read once it returned.
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

// writeTracker is the ResponseWriter of a request whose body is charged as
// it is read: it records whether the handler has answered, so that the
// middleware answers a refused read with 429 only when the handler wrote
// nothing. It passes Flush, Hijack and ReadFrom on to the ResponseWriter it
// wraps, and Unwrap gives it to http.ResponseController.
type writeTracker struct {
	http.ResponseWriter
	wrote bool
}

func (w *writeTracker) WriteHeader(code int) {
	// An informational status (103 Early Hints) is not the answer; 101
	// Switching Protocols is.
	if code >= 200 || code == http.StatusSwitchingProtocols {
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
