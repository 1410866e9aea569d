// Command keda-driver polls a KEDA external scaler exactly as KEDA and the HPA it creates do, and
// applies the result to a Deployment's scale subresource, so that the end-to-end tests can prove
// the scaler drives a real control plane without running KEDA itself.
//
// The loop mirrors KEDA's external scaler client (pkg/scalers/external_scaler.go) with KEDA's
// generated client package:
//
//   - GetMetricSpec once (retried every interval until it answers, as KEDA does while the
//     ScaledObject is not ready); the target is targetSizeFloat when > 0, else targetSize.
//   - Every polling interval: GetMetrics (metricValueFloat when > 0, else metricValue), then
//     IsActive. An error from either is an error for the whole poll, as in KEDA's
//     GetMetricsAndActivity.
//   - The HPA rule for the default AverageValue metric: desired = ceil(value / target), clamped
//     to [min, max]. The HPA's 10 % tolerance and its stabilisation windows are not modelled: the
//     test wants to see the rule itself.
//   - On an error (and no fallback configured) the HPA keeps the current replicas: it never
//     scales down on missing data. The driver does the same and reports the error.
//   - minReplicaCount must be >= 1: inference keeps serving, so scaling 0<->1 (KEDA's
//     activation, decided by IsActive alone) is out of scope; IsActive is still called and
//     logged, as KEDA uses it for the ScaledObject's Active condition.
//
// Every decision is one JSON line on stdout. Stops on SIGTERM/SIGINT.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	pb "github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

type metadataFlag map[string]string

func (m metadataFlag) String() string { return fmt.Sprint(map[string]string(m)) }

func (m metadataFlag) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("metadata %q is not key=value", v)
	}
	m[k] = val
	return nil
}

// decision is one line of the driver's log.
type decision struct {
	Time     string   `json:"time"`
	Event    string   `json:"event"` // spec, poll, stop
	Seq      int      `json:"seq,omitempty"`
	Metric   string   `json:"metric,omitempty"`
	Target   float64  `json:"target,omitempty"`
	Value    *float64 `json:"value,omitempty"`
	Active   *bool    `json:"active,omitempty"`
	Current  *int32   `json:"current,omitempty"`
	Desired  *int32   `json:"desired,omitempty"`
	Action   string   `json:"action,omitempty"` // scale, keep, error
	RPC      string   `json:"rpc,omitempty"`
	Code     string   `json:"code,omitempty"`
	Error    string   `json:"error,omitempty"`
	Duration float64  `json:"duration_ms,omitempty"`
}

var out = json.NewEncoder(os.Stdout)

func emit(d decision) {
	d.Time = time.Now().UTC().Format(time.RFC3339Nano)
	_ = out.Encode(d)
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "keda-driver: "+format+"\n", args...)
	os.Exit(2)
}

func main() {
	meta := metadataFlag{}
	scalerAddr := flag.String("scaler", "", "host:port of the external scaler (plaintext gRPC)")
	name := flag.String("name", "", "ScaledObject name sent to the scaler")
	namespace := flag.String("namespace", "", "namespace of the ScaledObject and the Deployment")
	deployment := flag.String("deployment", "", "Deployment to scale")
	minReplicas := flag.Int("min", 1, "minReplicaCount (>= 1)")
	maxReplicas := flag.Int("max", 100, "maxReplicaCount")
	interval := flag.Duration("interval", 30*time.Second, "pollingInterval")
	callTimeout := flag.Duration("call-timeout", 10*time.Second, "bound on each gRPC call (KEDA sets none; a test must not hang)")
	server := flag.String("server", "", "Kubernetes API server URL")
	caFile := flag.String("ca-file", "", "CA bundle of the API server")
	tokenFile := flag.String("token-file", "", "file holding a bearer token for the API server")
	flag.Var(meta, "metadata", "trigger metadata key=value (repeatable)")
	flag.Parse()
	if *scalerAddr == "" || *name == "" || *namespace == "" || *deployment == "" || *server == "" {
		fail("--scaler, --name, --namespace, --deployment and --server are required")
	}
	if *minReplicas < 1 || *maxReplicas < *minReplicas {
		fail("need 1 <= --min <= --max")
	}
	if *interval <= 0 {
		fail("--interval must be positive")
	}

	kube, err := newKubeClient(*server, *caFile, *tokenFile)
	if err != nil {
		fail("%v", err)
	}
	conn, err := grpc.NewClient(*scalerAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fail("connecting to %s: %v", *scalerAddr, err)
	}
	defer conn.Close()
	client := pb.NewExternalScalerClient(conn)
	ref := &pb.ScaledObjectRef{Name: *name, Namespace: *namespace, ScalerMetadata: meta}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ticker := time.NewTicker(*interval)
	defer ticker.Stop()

	var metricName string
	var target float64
	for seq := 1; ; seq++ {
		if metricName == "" {
			metricName, target = metricSpec(ctx, client, ref, *callTimeout)
		}
		if metricName != "" {
			poll(ctx, seq, client, ref, metricName, target, kube, *namespace, *deployment,
				int32(*minReplicas), int32(*maxReplicas), *callTimeout)
		}
		select {
		case <-ctx.Done():
			emit(decision{Event: "stop"})
			return
		case <-ticker.C:
		}
	}
}

// metricSpec calls GetMetricSpec; an empty name means "not yet" (the error is logged).
func metricSpec(ctx context.Context, c pb.ExternalScalerClient, ref *pb.ScaledObjectRef, timeout time.Duration) (string, float64) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := c.GetMetricSpec(cctx, ref)
	if err != nil {
		emit(decision{Event: "spec", RPC: "GetMetricSpec", Code: status.Code(err).String(), Error: err.Error()})
		return "", 0
	}
	if len(resp.MetricSpecs) != 1 {
		emit(decision{Event: "spec", RPC: "GetMetricSpec", Error: fmt.Sprintf("expected one metric spec, got %d", len(resp.MetricSpecs))})
		return "", 0
	}
	s := resp.MetricSpecs[0]
	t := float64(s.TargetSize)
	if s.TargetSizeFloat > 0 {
		t = s.TargetSizeFloat
	}
	if t <= 0 || s.MetricName == "" {
		emit(decision{Event: "spec", RPC: "GetMetricSpec", Error: fmt.Sprintf("unusable metric spec %v", s)})
		return "", 0
	}
	emit(decision{Event: "spec", Metric: s.MetricName, Target: t})
	return s.MetricName, t
}

// poll is one polling round: metrics and activity, then the HPA rule on the scale subresource.
func poll(ctx context.Context, seq int, c pb.ExternalScalerClient, ref *pb.ScaledObjectRef,
	metricName string, target float64, kube *kubeClient, ns, deployment string,
	minR, maxR int32, timeout time.Duration) {
	start := time.Now()
	d := decision{Event: "poll", Seq: seq, Metric: metricName, Target: target}
	done := func() {
		d.Duration = float64(time.Since(start).Microseconds()) / 1000
		emit(d)
	}
	current, err := kube.getReplicas(ctx, ns, deployment)
	if err != nil {
		d.Action, d.RPC, d.Error = "error", "scale", err.Error()
		done()
		return
	}
	d.Current = &current

	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	metrics, err := c.GetMetrics(cctx, &pb.GetMetricsRequest{ScaledObjectRef: ref, MetricName: metricName})
	if err != nil {
		// No fallback: the HPA cannot read the metric and keeps the replicas it has.
		d.Action, d.RPC, d.Code, d.Error = "keep", "GetMetrics", status.Code(err).String(), err.Error()
		done()
		return
	}
	if len(metrics.MetricValues) != 1 {
		d.Action, d.RPC, d.Error = "keep", "GetMetrics", fmt.Sprintf("expected one metric value, got %d", len(metrics.MetricValues))
		done()
		return
	}
	mv := metrics.MetricValues[0]
	value := float64(mv.MetricValue)
	if mv.MetricValueFloat > 0 {
		value = mv.MetricValueFloat
	}
	d.Value = &value
	active, err := c.IsActive(cctx, ref)
	if err != nil {
		d.Action, d.RPC, d.Code, d.Error = "keep", "IsActive", status.Code(err).String(), err.Error()
		done()
		return
	}
	d.Active = &active.Result

	desired := hpaDesired(value, target, minR, maxR)
	d.Desired = &desired
	if desired == current {
		d.Action = "keep"
		done()
		return
	}
	if err := kube.setReplicas(ctx, ns, deployment, desired); err != nil {
		d.Action, d.RPC, d.Error = "error", "scale", err.Error()
		done()
		return
	}
	d.Action = "scale"
	done()
}

// hpaDesired is the HPA's rule for an AverageValue external metric: ceil(value / target), within
// [min, max]. KEDA turns NaN, Inf and negative values into 0.
func hpaDesired(value, target float64, minR, maxR int32) int32 {
	if math.IsNaN(value) || math.IsInf(value, 0) || value < 0 {
		value = 0
	}
	raw := math.Ceil(value / target)
	if raw < float64(minR) {
		return minR
	}
	if raw > float64(maxR) {
		return maxR
	}
	return int32(raw)
}

// kubeClient reads and writes the scale subresource with plain HTTPS: client-go would multiply
// the driver's build time for two requests.
type kubeClient struct {
	server string
	token  string
	http   *http.Client
}

func newKubeClient(server, caFile, tokenFile string) (*kubeClient, error) {
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("reading CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("no certificate in %s", caFile)
		}
		tlsConfig.RootCAs = pool
	}
	var token string
	if tokenFile != "" {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return nil, fmt.Errorf("reading token file: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	return &kubeClient{
		server: strings.TrimSuffix(server, "/"),
		token:  token,
		http: &http.Client{
			Timeout:   10 * time.Second,
			Transport: &http.Transport{TLSClientConfig: tlsConfig},
		},
	}, nil
}

type scale struct {
	Spec struct {
		Replicas int32 `json:"replicas"`
	} `json:"spec"`
}

func (k *kubeClient) scaleURL(ns, name string) string {
	return fmt.Sprintf("%s/apis/apps/v1/namespaces/%s/deployments/%s/scale", k.server, ns, name)
}

func (k *kubeClient) do(ctx context.Context, method, url, contentType string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if k.token != "" {
		req.Header.Set("Authorization", "Bearer "+k.token)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := k.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("%s %s: %s: %s", method, url, resp.Status, strings.TrimSpace(string(b)))
	}
	return b, nil
}

func (k *kubeClient) getReplicas(ctx context.Context, ns, name string) (int32, error) {
	b, err := k.do(ctx, http.MethodGet, k.scaleURL(ns, name), "", nil)
	if err != nil {
		return 0, err
	}
	var s scale
	if err := json.Unmarshal(b, &s); err != nil {
		return 0, fmt.Errorf("decoding scale: %w", err)
	}
	return s.Spec.Replicas, nil
}

func (k *kubeClient) setReplicas(ctx context.Context, ns, name string, replicas int32) error {
	body := fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, replicas)
	_, err := k.do(ctx, http.MethodPatch, k.scaleURL(ns, name), "application/merge-patch+json", body)
	return err
}
