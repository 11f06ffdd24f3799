package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/gotrain/gotrain/cmd/gotrain/internal/top"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// diagnose --json: every field with its zero value (rank 0 has its rank),
// int64 as JSON numbers, proto field names; protojson reads it back into
// the same message.
func TestWriteJSONProto(t *testing.T) {
	resp := &gotrainv1.DiagnoseResponse{
		NowUnixNanos: 1764645600123456789, HangTimeoutMs: 300000,
		Status: &gotrainv1.JobStatus{RunId: "gotrain-1", State: "running", Generation: 0, WorldSize: 2,
			Ranks: []*gotrainv1.RankStatus{{Rank: 0, Hostname: "a"}, {Rank: 1, Hostname: "a"}}},
		Suspected: []*gotrainv1.HangVerdict{{Id: 7, Kind: "stuck", Details: []string{"x \"quoted\"\n"}}},
	}
	var b bytes.Buffer
	if err := writeJSON(&b, resp, true); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{`"now_unix_nanos": 1764645600123456789`, `"hang_timeout_ms": 300000`, `"generation": 0`,
		`"rank": 0`, `"failure": null`, `"restart_count": 0`, `"id": 7`, `"verdicts": []`} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %s:\n%s", want, out)
		}
	}
	var back gotrainv1.DiagnoseResponse
	if err := protojson.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatalf("protojson cannot read it back: %v\n%s", err, out)
	}
	if !proto.Equal(resp, &back) {
		t.Errorf("read back differs:\n got %v\nwant %v", &back, resp)
	}
	// Every field protojson emits with EmitUnpopulated is there, by the same name.
	ref, _ := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(resp)
	if a, e := jsonKeys(t, b.Bytes()), jsonKeys(t, ref); !equalKeys(a, e) {
		t.Errorf("keys %v, protojson's %v", a, e)
	}
}

// top --json goes through the same helper: zero values present, numbers
// as numbers.
func TestWriteJSONTop(t *testing.T) {
	snap := top.Snapshot{RunID: "gotrain-1", Ranks: []top.Rank{{Rank: 0, LastCollective: &top.Collective{Seq: 0}}}}
	var b bytes.Buffer
	if err := writeJSON(&b, snap, false); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"generation":0`, `"rank":0`, `"dtype":""`, `"waiting_seconds":0`, `"gpu_sample":null`} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("output lacks %s:\n%s", want, b.String())
		}
	}
}

// jsonKeys returns the set of object keys anywhere in doc.
func jsonKeys(t *testing.T, doc []byte) map[string]bool {
	var v any
	if err := json.Unmarshal(doc, &v); err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				keys[k] = true
				walk(e)
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(v)
	return keys
}

func equalKeys(a, b map[string]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}
