package trace

import (
	"bytes"
	"reflect"
	"testing"
)

// FuzzRead checks that Read never panics and that whatever it accepts
// survives a Write/Read round trip unchanged.
func FuzzRead(f *testing.F) {
	seeds := []string{
		`{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]}`,
		`{"timestamp": 1.25, "input_length": 1, "output_length": 0, "hash_ids": [0]}` + "\n\n" +
			`{"timestamp": 3, "input_length": 513, "output_length": 2, "hash_ids": [0, 5]}`,
		`{"timestamp": 0.5, "session_id": "a", "turn": 2, "user_id": "u", "input_length": 2, "output_length": 1, "hash_ids": [9], "messages": [{"role": "user", "content": "x\ny"}]}`,
		`{"timestamp": 0, "session_id": "s", "model": "base:lora-1", "input_length": 1, "output_length": 1, "hash_ids": [3]}` + "\n" +
			`{"timestamp": 1, "session_id": "t", "model": "", "input_length": 1, "output_length": 1, "hash_ids": [3]}`,
		`{"timestamp": 1e3, "input_length": 1, "output_length": 1, "hash_ids": [18446744073709551615]}`,
		"{}\n[]\n",
		`{"timestamp": "12", "input_length": 1, "output_length": 1, "hash_ids": [1]}`,
		"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16T18:15:50+00:00,1025,0\n",
		"\n timestamp,model,request tokens,response tokens,total tokens,log type\r\n5,ChatGPT,472,18,490,Conversation log\r\n5.5,GPT-4,0,0,0,API log\n",
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		reqs, err := Read(bytes.NewReader(data), "fuzz", FormatAuto)
		if err != nil {
			return
		}
		var b bytes.Buffer
		if err := Write(&b, reqs); err != nil {
			t.Fatalf("Write of a trace Read accepted: %v", err)
		}
		again, err := Read(&b, "fuzz-rt", FormatGorgo)
		if err != nil {
			t.Fatalf("Read of Write's output: %v\n%s", err, b.String())
		}
		if len(reqs) == 0 {
			return
		}
		if !reflect.DeepEqual(again, reqs) {
			t.Fatalf("round trip changed the requests:\n%+v\n%+v", reqs, again)
		}
	})
}

// FuzzParseModelWeights checks that ParseModelWeights never panics, that
// what it accepts is a valid mix that FormatModelWeights writes back
// unchanged, and that AssignModels draws only its models of positive
// weight.
func FuzzParseModelWeights(f *testing.F) {
	for _, s := range []string{"a:1,b:3", "a,b", "base:lora:2,base:x", "a:0,b:1", "a:-1", ":", "a:1e308,b:1e308", "a:NaN"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ws, err := ParseModelWeights(s)
		if err != nil {
			return
		}
		again, err := ParseModelWeights(FormatModelWeights(ws))
		if err != nil || !reflect.DeepEqual(again, ws) {
			t.Fatalf("%q: %v does not read back: %v, %v", s, ws, again, err)
		}
		weight := map[string]float64{}
		for _, w := range ws {
			weight[w.Name] = w.Weight
		}
		reqs := make([]Request, 16)
		AssignModels(reqs, ws, 1)
		for _, r := range reqs {
			if !(weight[r.Model] > 0) {
				t.Fatalf("%q: drew %q", s, r.Model)
			}
		}
	})
}
