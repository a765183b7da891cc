// A reference Offtake sidecar processor in Go, standard library only: the same behaviour as
// examples/sidecar/processor.py, to show that the protocol (docs/sidecar-protocol.md) needs
// nothing but HTTP, JSON and base64.
//
//	go build -o sidecar . && ./sidecar --port 8080
package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

const protocolVersion = 1

type batch struct {
	Version int               `json:"version"`
	Format  string            `json:"format"`
	Records []json.RawMessage `json:"records"`
}

// record holds the fields this processor reads; the echo mode answers with the raw JSON.
type record struct {
	ID          string          `json:"id"`
	Value       json.RawMessage `json:"value"`
	ValueBase64 *string         `json:"valueBase64"`
}

type errorBody struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

type result struct {
	ID           string     `json:"id"`
	Values       []any      `json:"values,omitempty"`
	ValuesBase64 []*string  `json:"valuesBase64,omitempty"`
	Error        *errorBody `json:"error,omitempty"`
	Retriable    *bool      `json:"retriable,omitempty"`
	drop         bool
}

// MarshalJSON writes "values": [] for a dropped record (omitempty would leave the field out,
// which also means drop, but an explicit empty list reads better in logs).
func (r result) MarshalJSON() ([]byte, error) {
	type plain result
	if r.drop {
		return json.Marshal(struct {
			ID     string `json:"id"`
			Values []any  `json:"values"`
		}{r.ID, []any{}})
	}
	return json.Marshal(plain(r))
}

type poison string

func (p poison) Error() string { return string(p) }

func enrich(raw json.RawMessage, format string) (result, error) {
	var rec record
	if err := json.Unmarshal(raw, &rec); err != nil {
		return result{}, err
	}
	res := result{ID: rec.ID}
	switch format {
	case "bytes":
		if rec.ValueBase64 == nil {
			res.ValuesBase64 = []*string{nil}
			return res, nil
		}
		data, err := base64.StdEncoding.DecodeString(*rec.ValueBase64)
		if err != nil {
			return res, err
		}
		if bytes.HasPrefix(data, []byte("poison")) {
			return res, poison("value starts with 'poison'")
		}
		res.ValuesBase64 = []*string{rec.ValueBase64}
	case "string":
		var s *string
		if err := json.Unmarshal(rec.Value, &s); err != nil {
			return res, err
		}
		if s == nil {
			res.Values = []any{nil}
		} else if *s == "poison" {
			return res, poison("value is 'poison'")
		} else {
			res.Values = []any{strings.ToUpper(*s)}
		}
	default:
		dec := json.NewDecoder(bytes.NewReader(rec.Value))
		dec.UseNumber() // keep numbers exactly as they came
		var v any
		if len(rec.Value) > 0 {
			if err := dec.Decode(&v); err != nil {
				return res, err
			}
		}
		obj, ok := v.(map[string]any)
		if !ok {
			res.Values = []any{v}
			return res, nil
		}
		if obj["poison"] == true {
			return res, poison(`the record has "poison": true`)
		}
		if obj["drop"] == true {
			res.drop = true
			return res, nil
		}
		if name, ok := obj["name"].(string); ok {
			obj["name"] = strings.ToUpper(name)
		}
		obj["processedBy"] = "example-sidecar"
		if split, ok := obj["split"].([]any); ok {
			delete(obj, "split")
			for _, part := range split {
				out := map[string]any{"part": part}
				for k, val := range obj {
					out[k] = val
				}
				res.Values = append(res.Values, out)
			}
			if len(split) == 0 {
				res.drop = true
			}
			return res, nil
		}
		res.Values = []any{obj}
	}
	return res, nil
}

func echo(raw json.RawMessage, _ string) (result, error) {
	var rec record
	if err := json.Unmarshal(raw, &rec); err != nil {
		return result{}, err
	}
	return result{ID: rec.ID, Values: []any{raw}}, nil
}

func reply(w http.ResponseWriter, status int, payload any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Offtake-Protocol", fmt.Sprint(protocolVersion))
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(payload)
}

func failure(kind, message string) map[string]any {
	return map[string]any{"error": errorBody{Type: kind, Message: message}}
}

func main() {
	port := flag.Int("port", 8080, "port to listen on; 0 picks a free one")
	host := flag.String("host", "127.0.0.1", "0.0.0.0 in a pod, so that the kubelet's probes reach /healthz")
	path := flag.String("path", "/v1/process", "where batches are POSTed")
	mode := flag.String("mode", "enrich", "enrich | echo")
	delay := flag.Duration("delay", 0, "pause per batch, e.g. 2s")
	flag.Parse()

	handle := enrich
	if *mode == "echo" {
		handle = echo
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusOK, map[string]any{"status": "ok", "protocols": []int{protocolVersion}})
	})
	mux.HandleFunc(*path, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			reply(w, http.StatusMethodNotAllowed, failure("MethodNotAllowed", "POST only"))
			return
		}
		var b batch
		if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
			reply(w, http.StatusBadRequest, failure("BadRequest", err.Error()))
			return
		}
		if b.Version != protocolVersion {
			body := failure("UnsupportedVersion", fmt.Sprintf("this processor speaks version %d, got %d", protocolVersion, b.Version))
			body["supported"] = []int{protocolVersion}
			reply(w, http.StatusBadRequest, body)
			return
		}
		time.Sleep(*delay)
		results := make([]result, 0, len(b.Records))
		for _, raw := range b.Records {
			res, err := handle(raw, b.Format)
			if err != nil {
				var p poison
				retriable := !errors.As(err, &p)
				kind := "PoisonRecord"
				if retriable {
					kind = fmt.Sprintf("%T", err)
				}
				res = result{ID: res.ID, Error: &errorBody{Type: kind, Message: err.Error()}, Retriable: &retriable}
			}
			results = append(results, res)
		}
		reply(w, http.StatusOK, map[string]any{"results": results})
	})

	listener, err := net.Listen("tcp", net.JoinHostPort(*host, fmt.Sprint(*port)))
	if err != nil {
		log.Fatal(err)
	}
	server := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	// SIGTERM: finish the requests in hand, then exit. Registered before "listening" is
	// printed, so that a signal sent any time after start-up is handled.
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, os.Interrupt)
	go func() {
		<-stop
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = server.Shutdown(ctx)
	}()
	fmt.Printf("offtake example sidecar (go) listening on %s:%d (POST %s, mode %s)\n",
		*host, listener.Addr().(*net.TCPAddr).Port, *path, *mode)
	if err := server.Serve(listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}
