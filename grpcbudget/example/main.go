// Command example is a gRPC server whose calls each run under a memory
// budget of their own (package github.com/memctl/memctl/grpcbudget): a call
// that would need more than its budget, or more than the shared pool has
// left, gets status 8 RESOURCE_EXHAUSTED and the server keeps serving
// everyone else.
//
// Its service, memctl.example.Store, is a hand-written grpc.ServiceDesc
// (no protoc). Alloc, AllocWrapped, AllocUndercharged, Hold and
// AllocStream take a google.protobuf.Int64Value size in bytes (package
// internal/examplestore); Upload and UploadStream take
// google.protobuf.BytesValue messages, charged before they are
// unmarshaled, and return their length (Upload holds its message for the
// time the hold-ms metadata asks).
//
//	GOMEMLIMIT=512MiB go run ./example -addr 127.0.0.1:50051 -request-budget 64MiB
//
// A call of 1 GiB to Alloc gets code 8 and grpc-retry-pushback-ms: -1 (do
// not retry); a call refused because the pool is full carries
// grpc-retry-pushback-ms: 1000.
//
// Run it with -h for its flags. It prints "listening on ADDR" once it
// accepts connections, and stops on SIGINT or SIGTERM.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/memctl/memctl"
	"github.com/memctl/memctl/grpcbudget"
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
	addr := fs.String("addr", "127.0.0.1:50051", "listen address")
	budget := fs.String("request-budget", "64MiB", "each call's budget in bytes (KiB, MiB, GiB suffixes)")
	poolSize := fs.String("pool", "0", "the shared pool in bytes (0: half of GOMEMLIMIT)")
	budgets := fs.Bool("budgets", true, "run the budget interceptors")
	messages := fs.Bool("messages", true, "charge each message before it is unmarshaled")
	maxRecv := fs.String("max-recv", "", "the maximum receive size in bytes (default: the per-call budget)")
	httpAddr := fs.String("http", "", "listen address of the HTTP side on the same pool (empty: none)")
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
	recv := min(limit, math.MaxInt32)
	if *maxRecv != "" {
		if recv, err = bytesize.Parse(*maxRecv); err != nil || recv == 0 || recv > math.MaxInt32 {
			return fmt.Errorf("-max-recv %q: want a positive byte count under 2 GiB", *maxRecv)
		}
	}
	ctl, err := memctl.Start() // THP off, GOMEMLIMIT from the cgroup, the trimmer
	if err != nil {
		return err
	}
	defer ctl.Close()
	// One pool for gRPC and HTTP; CancelLargest: under heap pressure the
	// largest call or request is canceled, whatever its transport.
	pool, err := limits.NewPool(limits.PoolConfig{Name: "grpc", Limit: size, CancelLargest: true})
	if err != nil {
		return err
	}
	defer pool.Close()
	if *httpAddr != "" {
		h, err := HTTPHandler(pool, limit)
		if err != nil {
			return err
		}
		hln, err := net.Listen("tcp", *httpAddr)
		if err != nil {
			return err
		}
		hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		defer hs.Close()
		go func() { _ = hs.Serve(hln) }()
		fmt.Fprintf(stdout, "http on %s\n", hln.Addr())
	}
	var opts []grpc.ServerOption
	if *budgets {
		options := grpcbudget.ServerOptions
		if !*messages {
			options = InterceptorOptions
		}
		if opts, err = options(pool, grpcbudget.Config{Limit: limit, AfterBurst: memctl.AfterBurst}); err != nil {
			return err
		}
	}
	srv := NewServer(append(opts, grpc.MaxRecvMsgSize(int(recv)))...)
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "listening on %s\n", ln.Addr())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		srv.GracefulStop()
	}()
	return srv.Serve(ln)
}

// HTTPHandler returns the HTTP side of the service on the gRPC calls' pool:
// /alloc?n= charges and builds n bytes behind the pool's middleware (each
// request's budget limit bytes, 429 resource_exhausted past it), and
// /debug/memctl shows what memctl decided, the pool included.
func HTTPHandler(pool *limits.Pool, limit int64) (http.Handler, error) {
	budget, err := pool.Middleware(limits.HTTPConfig{Limit: limit, AfterBurst: memctl.AfterBurst})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/alloc", budget(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		n, err := examplestore.Alloc(r.Context(), n)
		if err != nil {
			if !limits.WriteError(w, err) {
				http.Error(w, err.Error(), http.StatusBadRequest)
			}
			return
		}
		fmt.Fprintln(w, n)
	})))
	mux.Handle("/debug/memctl", memctl.Handler())
	return mux, nil
}

// InterceptorOptions returns the unary and stream budget interceptors
// alone, which open each call's account once its request is unmarshaled
// (-messages=false).
func InterceptorOptions(pool *limits.Pool, cfg grpcbudget.Config) ([]grpc.ServerOption, error) {
	unary, err := grpcbudget.UnaryServerInterceptor(pool, cfg)
	if err != nil {
		return nil, err
	}
	stream, err := grpcbudget.StreamServerInterceptor(pool, cfg)
	if err != nil {
		return nil, err
	}
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(unary), grpc.ChainStreamInterceptor(stream)}, nil
}

// NewServer returns a gRPC server with the Store service registered.
func NewServer(opts ...grpc.ServerOption) *grpc.Server {
	srv := grpc.NewServer(opts...)
	srv.RegisterService(&storeDesc, struct{}{})
	return srv
}

// ServiceName is the Store service's full name.
const ServiceName = examplestore.ServiceName

// method is the unary method name: it decodes a new message of newIn's and
// answers fn's count as an Int64Value.
func method(name string, newIn func() any, fn func(context.Context, any) (int64, error)) grpc.MethodDesc {
	return grpc.MethodDesc{
		MethodName: name,
		Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			in := newIn()
			if err := dec(in); err != nil {
				return nil, err
			}
			call := func(ctx context.Context, req any) (any, error) {
				n, err := fn(ctx, req)
				if err != nil {
					return nil, err
				}
				return wrapperspb.Int64(n), nil
			}
			if icpt == nil {
				return call(ctx, in)
			}
			return icpt(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/" + ServiceName + "/" + name}, call)
		},
	}
}

// sized is the Int64Value method name, served by fn.
func sized(name string, fn func(context.Context, int64) (int64, error)) grpc.MethodDesc {
	return method(name, func() any { return new(wrapperspb.Int64Value) }, func(ctx context.Context, req any) (int64, error) {
		return fn(ctx, req.(*wrapperspb.Int64Value).GetValue())
	})
}

// uploadLen returns the message's length once it held it for the time the
// call's hold-ms metadata asks, or until the caller cancels.
func uploadLen(ctx context.Context, req any) (int64, error) {
	b := req.(*wrapperspb.BytesValue).GetValue()
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("hold-ms"); len(v) == 1 {
		examplestore.Wait(ctx, v[0])
	}
	runtime.KeepAlive(b) // held, as by a handler that works on it
	return int64(len(b)), nil
}

var storeDesc = grpc.ServiceDesc{
	ServiceName: ServiceName,
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		sized("Alloc", examplestore.Alloc),
		sized("AllocWrapped", examplestore.AllocWrapped),
		sized("AllocUndercharged", examplestore.AllocUndercharged),
		sized("Hold", examplestore.Hold),
		method("Upload", func() any { return new(wrapperspb.BytesValue) }, uploadLen),
	},
	Streams: []grpc.StreamDesc{{
		StreamName:    "AllocStream",
		ServerStreams: true,
		Handler: func(srv any, ss grpc.ServerStream) error {
			in := new(wrapperspb.Int64Value)
			if err := ss.RecvMsg(in); err != nil {
				return err
			}
			n, err := examplestore.Alloc(ss.Context(), in.GetValue())
			if err != nil {
				return err
			}
			return ss.SendMsg(wrapperspb.Int64(n))
		},
	}, {
		StreamName:    "UploadStream",
		ClientStreams: true,
		Handler: func(srv any, ss grpc.ServerStream) error {
			var total int64
			for {
				in := new(wrapperspb.BytesValue)
				err := ss.RecvMsg(in)
				if err == io.EOF {
					return ss.SendMsg(wrapperspb.Int64(total))
				}
				if err != nil {
					return err // a refused message's error: code 8
				}
				total += int64(len(in.GetValue()))
			}
		},
	}},
}
