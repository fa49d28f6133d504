// Command etcd runs a single-member etcd 3.6 for the sandbox's control plane.
//
// It embeds go.etcd.io/etcd/server/v3 instead of shipping a release binary, so
// the sandbox is built only from Go modules. Loopback only; fsync is off
// because the sandbox's data lives exactly as long as the sandbox.
package main

import (
	"flag"
	"fmt"
	"log"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

func mustURL(raw string) url.URL {
	u, err := url.Parse(raw)
	if err != nil {
		log.Fatalf("etcd: bad URL %q: %v", raw, err)
	}
	return *u
}

func main() {
	dataDir := flag.String("data-dir", "", "folder for etcd's data (required)")
	client := flag.String("listen-client-url", "http://127.0.0.1:2379", "client URL")
	peer := flag.String("listen-peer-url", "http://127.0.0.1:2380", "peer URL")
	flag.Parse()
	if *dataDir == "" {
		fmt.Fprintln(os.Stderr, "etcd: --data-dir is required")
		os.Exit(2)
	}
	cfg := embed.NewConfig()
	cfg.Dir = *dataDir
	cfg.Name = "sandbox"
	cfg.LogLevel = "warn"
	cfg.UnsafeNoFsync = true
	cu, pu := mustURL(*client), mustURL(*peer)
	cfg.ListenClientUrls = []url.URL{cu}
	cfg.AdvertiseClientUrls = []url.URL{cu}
	cfg.ListenPeerUrls = []url.URL{pu}
	cfg.AdvertisePeerUrls = []url.URL{pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		os.Exit(1)
	}
	select {
	case <-e.Server.ReadyNotify():
		fmt.Println("etcd ready")
	case <-time.After(60 * time.Second):
		e.Server.Stop()
		fmt.Fprintln(os.Stderr, "etcd: not ready after 60s")
		os.Exit(1)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-stop:
	case err := <-e.Err():
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
	}
	e.Close()
}
