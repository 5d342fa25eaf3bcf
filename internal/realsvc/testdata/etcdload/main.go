// Command etcdload writes and reads the real-service suite's etcd data
// (internal/realsvc): put writes n values of size bytes under /realsvc/,
// read reads every key once, then random keys at a fixed rate until the
// duration has passed. It prints one summary line.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func main() {
	endpoint := flag.String("endpoint", "127.0.0.1:2379", "client URL")
	n := flag.Int("n", 6500, "number of keys")
	size := flag.Int("size", 100<<10, "value size in bytes (put)")
	conc := flag.Int("c", 8, "concurrent requests")
	rate := flag.Int("rate", 50, "random reads a second after the first pass (read)")
	dur := flag.Duration("d", 30*time.Second, "how long to read (read)")
	flag.Parse()
	if flag.NArg() != 1 {
		log.Fatal("usage: etcdload [flags] put|read")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{*endpoint}, DialTimeout: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	key := func(i int) string { return fmt.Sprintf("/realsvc/%06d", i) }
	t0 := time.Now()
	switch flag.Arg(0) {
	case "put":
		val := make([]byte, *size)
		for i := range val {
			val[i] = byte('a' + rand.IntN(26))
		}
		each(*n, *conc, func(i int) error {
			_, err := cli.Put(ctx, key(i), string(val))
			return err
		})
		fmt.Printf("etcdload: put %d x %d bytes in %.1f s\n", *n, *size, time.Since(t0).Seconds())
	case "read":
		var bytes atomic.Int64
		get := func(i int) error {
			r, err := cli.Get(ctx, key(i), clientv3.WithSerializable())
			if err == nil && len(r.Kvs) != 1 {
				err = fmt.Errorf("%s: %d values", key(i), len(r.Kvs))
			}
			if err == nil {
				bytes.Add(int64(len(r.Kvs[0].Value)))
			}
			return err
		}
		each(*n, *conc, get)
		pass, all := time.Since(t0), bytes.Load()
		gets := 0
		tick := time.NewTicker(time.Second / time.Duration(*rate))
		defer tick.Stop()
		for time.Since(t0) < *dur {
			<-tick.C
			if err := get(rand.IntN(*n)); err != nil {
				log.Fatal(err)
			}
			gets++
		}
		fmt.Printf("etcdload: read all %d keys (%d MiB) in %.1f s, then %d random gets\n", *n, all>>20, pass.Seconds(), gets)
	default:
		log.Fatalf("etcdload: unknown mode %q", flag.Arg(0))
	}
}

// each runs f(0..n-1) on conc goroutines and exits on the first error.
func each(n, conc int, f func(int) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					fmt.Fprintln(os.Stderr, "etcdload:", err)
					os.Exit(1)
				}
			}
		})
	}
	wg.Wait()
}
