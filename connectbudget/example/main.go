// Command example is a Connect server (connectrpc.com/connect) whose calls
// each run under a memory budget of their own (package
// github.com/memctl/memctl/connectbudget): a call that would need more
// than its budget, or more than the shared pool has left, gets
// resource_exhausted (HTTP 429 in the Connect protocol, code 8 in gRPC) and
// the server keeps serving everyone else.
//
// Its service, memctl.example.Store, needs no generated code. Alloc,
// AllocWrapped, AllocUndercharged, Hold and AllocStream take a
// google.protobuf.Int64Value size in bytes (package internal/examplestore);
// Upload and UploadStream take google.protobuf.BytesValue messages, charged
// before they are unmarshaled, and return their length (Upload holds its
// message for the time the Hold-Ms request header asks).
//
//	GOMEMLIMIT=512MiB go run ./example -addr 127.0.0.1:8080 -request-budget 64MiB
//	curl -si -H 'Content-Type: application/json' -d '"1073741824"' http://127.0.0.1:8080/memctl.example.Store/Alloc
//
// answers 429 {"code":"resource_exhausted",...} with no Retry-After; a call
// refused because the pool is full carries Retry-After: 1. The server
// speaks HTTP/1.1 and h2c, so gRPC clients reach it too.
//
// Run it with -h for its flags. It prints "listening on http://ADDR" once
// it accepts connections, and stops on SIGINT or SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/memctl/memctl"
	"github.com/memctl/memctl/connectbudget"
	"github.com/memctl/memctl/internal/bytesize"
	"github.com/memctl/memctl/internal/examplestore"
	"github.com/memctl/memctl/limits"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "example:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("example", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8080", "listen address")
	budget := fs.String("request-budget", "64MiB", "each call's budget in bytes (KiB, MiB, GiB suffixes)")
	poolSize := fs.String("pool", "0", "the shared pool in bytes (0: half of GOMEMLIMIT)")
	budgets := fs.Bool("budgets", true, "run the budget interceptor")
	messages := fs.Bool("messages", true, "charge each request message before it is unmarshaled")
	maxRead := fs.String("max-read", "", "the maximum message size read in bytes (default: the per-call budget)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	limit, err := bytesize.Parse(*budget)
	if err != nil || limit == 0 {
		return fmt.Errorf("-request-budget %q: want a positive byte count", *budget)
	}
	size, err := bytesize.Parse(*poolSize)
	if err != nil {
		return fmt.Errorf("-pool: %w", err)
	}
	readMax := min(limit, math.MaxInt32)
	if *maxRead != "" {
		if readMax, err = bytesize.Parse(*maxRead); err != nil || readMax == 0 || readMax > math.MaxInt32 {
			return fmt.Errorf("-max-read %q: want a positive byte count under 2 GiB", *maxRead)
		}
	}
	ctl, err := memctl.Start() // THP off, GOMEMLIMIT from the cgroup, the trimmer
	if err != nil {
		return err
	}
	defer ctl.Close()
	pool, err := limits.NewPool(limits.PoolConfig{Name: "connect", Limit: size, CancelLargest: true})
	if err != nil {
		return err
	}
	defer pool.Close()
	var opts []connect.HandlerOption
	if *budgets {
		options := connectbudget.HandlerOptions
		if !*messages {
			options = InterceptorOptions
		}
		o, err := options(pool, connectbudget.Config{Limit: limit, AfterBurst: memctl.AfterBurst})
		if err != nil {
			return err
		}
		opts = append(opts, o)
	}
	opts = append(opts, connect.WithReadMaxBytes(int(readMax)))
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := NewServer(NewHandler(opts...))
	fmt.Fprintf(stdout, "listening on http://%s\n", ln.Addr())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		_ = srv.Shutdown(context.Background())
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// NewServer returns an HTTP server for h that speaks HTTP/1.1 and HTTP/2
// without TLS (h2c, for gRPC clients).
func NewServer(h http.Handler) *http.Server {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return &http.Server{Handler: h, Protocols: &p}
}

// InterceptorOptions returns the interceptor alone, which opens each call's
// account once its request is unmarshaled (-messages=false).
func InterceptorOptions(pool *limits.Pool, cfg connectbudget.Config) (connect.HandlerOption, error) {
	i, err := connectbudget.NewInterceptor(pool, cfg)
	if err != nil {
		return nil, err
	}
	return connect.WithInterceptors(i), nil
}

// Procedure returns the path of the Store's method name.
func Procedure(name string) string { return "/" + examplestore.ServiceName + "/" + name }

// NewHandler returns a mux with the Store's procedures, each with opts.
func NewHandler(opts ...connect.HandlerOption) *http.ServeMux {
	mux := http.NewServeMux()
	for name, fn := range map[string]func(context.Context, int64) (int64, error){
		"Alloc":             examplestore.Alloc,
		"AllocWrapped":      examplestore.AllocWrapped,
		"AllocUndercharged": examplestore.AllocUndercharged,
		"Hold":              examplestore.Hold,
	} {
		mux.Handle(Procedure(name), connect.NewUnaryHandler(Procedure(name),
			func(ctx context.Context, req *connect.Request[wrapperspb.Int64Value]) (*connect.Response[wrapperspb.Int64Value], error) {
				n, err := fn(ctx, req.Msg.GetValue())
				if err != nil {
					return nil, err
				}
				return connect.NewResponse(wrapperspb.Int64(n)), nil
			}, opts...))
	}
	mux.Handle(Procedure("Upload"), connect.NewUnaryHandler(Procedure("Upload"),
		func(ctx context.Context, req *connect.Request[wrapperspb.BytesValue]) (*connect.Response[wrapperspb.Int64Value], error) {
			b := req.Msg.GetValue()
			examplestore.Wait(ctx, req.Header().Get("Hold-Ms"))
			runtime.KeepAlive(b) // held, as by a handler that works on it
			return connect.NewResponse(wrapperspb.Int64(int64(len(b)))), nil
		}, opts...))
	mux.Handle(Procedure("UploadStream"), connect.NewClientStreamHandler(Procedure("UploadStream"),
		func(ctx context.Context, st *connect.ClientStream[wrapperspb.BytesValue]) (*connect.Response[wrapperspb.Int64Value], error) {
			var total int64
			for st.Receive() {
				total += int64(len(st.Msg().GetValue()))
			}
			if err := st.Err(); err != nil {
				return nil, err // a refused message's error: resource_exhausted
			}
			return connect.NewResponse(wrapperspb.Int64(total)), nil
		}, opts...))
	mux.Handle(Procedure("AllocStream"), connect.NewServerStreamHandler(Procedure("AllocStream"),
		func(ctx context.Context, req *connect.Request[wrapperspb.Int64Value], st *connect.ServerStream[wrapperspb.Int64Value]) error {
			n, err := examplestore.Alloc(ctx, req.Msg.GetValue())
			if err != nil {
				return err
			}
			return st.Send(wrapperspb.Int64(n))
		}, opts...))
	return mux
}
