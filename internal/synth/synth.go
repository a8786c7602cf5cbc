// Package synth is the prompt text gorgo makes up for a trace that has
// none: readable words drawn from each block's id, so that two prompts
// sharing their first blocks share their first bytes, and the canonical
// prompt has exactly the trace's tokens by the estimator. The replayer
// sends it; the simulator reads the same prefix key from it that the live
// router would.
package synth

import (
	"math/rand/v2"

	"github.com/gorgo-llm/gorgo/internal/prompt"
	"github.com/gorgo-llm/gorgo/internal/trace"
)

// BlockBytes is the length in bytes of the synthetic text of one full block:
// trace.BlockTokens tokens at the estimator's 4 bytes per token (2048).
const BlockBytes = trace.BlockTokens * prompt.DefaultBytesPerToken

// chatOverhead is what prompt.Chat adds around a single user message:
// "user\n" before the content and "\n" after it (6 bytes).
const chatOverhead = len("user\n") + len("\n")

// blockNewline is the offset in every block's text of a forced newline. A
// prompt that ends exactly at the end of a block ends its content there and
// prompt.Chat appends "\n"; with the newline in the text, that canonical
// prompt is a byte prefix of the canonical prompt of any longer request that
// continues the same blocks, so an engine that hashes canonical bytes sees
// the whole shared prefix.
const blockNewline = BlockBytes - chatOverhead

// textSalt separates the text streams from other uses of the block ids.
const textSalt = 0x5eed_7e47_b10c_0001

// Messages returns the chat messages the replayer sends for r: r.Messages
// when the trace carries them, otherwise one user message whose content is
// SyntheticContent(r.HashIDs, r.InputTokens).
func Messages(r *trace.Request) []prompt.Message {
	if len(r.Messages) > 0 {
		msgs := make([]prompt.Message, len(r.Messages))
		for i, m := range r.Messages {
			msgs[i] = prompt.Message{Role: m.Role, Content: m.Content}
		}
		return msgs
	}
	content := AppendContent(nil, r.HashIDs, r.InputTokens)
	return []prompt.Message{{Role: "user", Content: string(content)}}
}

// AppendContent appends to dst the synthetic content of a prompt of
// inputTokens tokens whose blocks have the given ids, and returns the
// extended slice.
//
// Every full block is BlockBytes bytes of readable words drawn from a stream
// seeded with its id alone, so equal ids give equal text and two prompts
// that share their first k ids share their first k·BlockBytes bytes. The
// last block is the start of its id's stream, shortened by the 6 bytes
// prompt.Chat adds around a single user message, so that the canonical
// prompt has exactly 4·inputTokens bytes and the estimator reads exactly
// inputTokens tokens. A prompt whose last block holds a single token (or an
// inputTokens of 1) cannot hold that overhead; it gets an empty last block
// and is estimated at one token more than inputTokens.
//
// Ids missing from ids (a trace whose hash ids are fewer than its blocks)
// are derived from the previous id and the position.
func AppendContent(dst []byte, ids []uint64, inputTokens int) []byte {
	n := trace.BlockCount(inputTokens)
	var id uint64
	for i := range n {
		if i < len(ids) {
			id = ids[i]
		} else {
			id = mix64(id ^ uint64(i+1))
		}
		size := BlockBytes
		if i == n-1 {
			tokens := inputTokens - (n-1)*trace.BlockTokens
			size = max(0, prompt.Estimator{}.Bytes(tokens)-chatOverhead)
		}
		dst = AppendBlockText(dst, id, size)
	}
	return dst
}

// AppendBlockText appends the first size bytes (at most BlockBytes; 0 or
// less appends nothing) of the text of the block with the given id: words
// from a fixed vocabulary in sentences, chosen by a PCG seeded with the id,
// with a newline at byte BlockBytes-6. The text of an id is the same
// whatever size is asked for, cut to size.
func AppendBlockText(dst []byte, id uint64, size int) []byte {
	size = min(size, BlockBytes)
	if size <= 0 {
		return dst
	}
	start := len(dst)
	r := rand.New(rand.NewPCG(mix64(id), textSalt))
	left := 0 // words left in the current sentence
	for len(dst)-start < size {
		w := vocabulary[r.IntN(len(vocabulary))]
		first := left == 0
		if first {
			left = 6 + r.IntN(12)
		}
		at := len(dst)
		dst = append(dst, w...)
		if first {
			dst[at] -= 'a' - 'A'
		}
		left--
		if left == 0 {
			dst = append(dst, '.')
		}
		dst = append(dst, ' ')
	}
	dst = dst[:start+size]
	if size > blockNewline {
		dst[start+blockNewline] = '\n'
	}
	return dst
}

// mix64 is the splitmix64 finaliser: it spreads consecutive ids (Mooncake
// numbers its blocks 0, 1, 2, ...) over the whole seed space.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// vocabulary is the fixed word list of the synthetic text: common English
// words, all lower case ASCII letters.
var vocabulary = [...]string{
	"the", "of", "and", "to", "in", "is", "that", "for", "it", "as",
	"was", "with", "be", "by", "on", "not", "he", "this", "are", "or",
	"his", "from", "at", "which", "but", "have", "an", "had", "they", "you",
	"were", "their", "one", "all", "we", "can", "her", "has", "there", "been",
	"if", "more", "when", "will", "would", "who", "so", "no", "time", "people",
	"year", "way", "day", "man", "thing", "woman", "life", "child", "world", "school",
	"state", "family", "student", "group", "country", "problem", "hand", "part", "place", "case",
	"week", "company", "system", "program", "question", "work", "government", "number", "night", "point",
	"home", "water", "room", "mother", "area", "money", "story", "fact", "month", "lot",
	"right", "study", "book", "eye", "job", "word", "business", "issue", "side", "kind",
	"head", "house", "service", "friend", "father", "power", "hour", "game", "line", "end",
	"member", "law", "car", "city", "community", "name", "president", "team", "minute", "idea",
	"kid", "body", "information", "back", "parent", "face", "others", "level", "office", "door",
	"health", "person", "art", "war", "history", "party", "result", "change", "morning", "reason",
	"research", "girl", "guy", "moment", "air", "teacher", "force", "education", "good", "new",
	"first", "last", "long", "great", "little", "own", "other", "old", "big", "high",
	"different", "small", "large", "next", "early", "young", "important", "few", "public", "bad",
	"same", "able", "make", "know", "take", "see", "come", "think", "look", "want",
	"give", "use", "find", "tell", "ask", "seem", "feel", "try", "leave", "call",
	"keep", "begin", "help", "talk", "turn", "start", "show", "hear", "play", "run",
	"move", "like", "live", "believe", "hold", "bring", "happen", "write", "provide", "sit",
	"stand", "lose", "pay", "meet", "include", "continue", "set", "learn", "lead", "understand",
	"watch", "follow", "stop", "create", "speak", "read", "allow", "add", "spend", "grow",
	"open", "walk", "win", "offer", "remember", "love", "consider", "appear", "buy", "wait",
	"serve", "die", "send", "expect", "build", "stay", "fall", "cut", "reach", "kill",
	"remain", "suggest", "raise", "pass", "sell", "require", "report", "decide", "pull", "explain",
}

// firstBlock is what the prefix key of a request without messages depends
// on: its first block's id, how much of that block's text the key reads,
// and whether the content ends there.
type firstBlock struct {
	id    uint64
	size  int
	ended bool
}

// firstBlockOf describes r's first block as the prefix key reads it (r
// has no messages).
func firstBlockOf(r *trace.Request, est prompt.Estimator) firstBlock {
	n := est.Bytes(prompt.PrefixKeyTokens)
	id := mix64(1)
	if len(r.HashIDs) > 0 {
		id = r.HashIDs[0]
	}
	size := BlockBytes
	if r.InputTokens <= trace.BlockTokens {
		size = max(0, prompt.Estimator{}.Bytes(min(r.InputTokens, trace.BlockTokens))-chatOverhead)
	}
	return firstBlock{id: id, size: min(size, n), ended: r.InputTokens <= trace.BlockTokens && size < n}
}

// appendPrefixText appends the start of r's canonical prompt that its
// prefix key reads.
func appendPrefixText(dst []byte, r *trace.Request, est prompt.Estimator) []byte {
	if len(r.Messages) > 0 {
		return prompt.Chat(dst, Messages(r))
	}
	// "user\n", the content's first bytes and, if the content ends before
	// the key's bytes, its "\n": only the first block can count.
	b := firstBlockOf(r, est)
	dst = append(dst, "user\n"...)
	dst = AppendBlockText(dst, b.id, b.size)
	if b.ended {
		dst = append(dst, '\n')
	}
	return dst
}

// Keys gives requests their prefix keys: the key the live router reads
// (prompt.PrefixKey) from the prompt the replayer sends, so that the
// simulator's simple session affinity splits sessions as the live proxy
// does. It reuses one buffer, and a request without messages whose first
// block it has seen costs a map lookup (a trace's requests share their
// first blocks: a system prompt, a session's history).
type Keys struct {
	est  prompt.Estimator
	buf  []byte
	msgs []prompt.Message
	seen map[firstBlock]uint64
}

// NewKeys returns Keys for prompts estimated by est.
func NewKeys(est prompt.Estimator) *Keys {
	return &Keys{est: est, seen: map[firstBlock]uint64{}}
}

// Instructions returns the key of r's instructions as the live router
// reads it (prompt.InstructionsKey): its messages' opening system or
// developer messages; 0 for a request without them (every request the
// replayer makes up is one user message).
func (k *Keys) Instructions(r *trace.Request) uint64 {
	n := 0
	for n < len(r.Messages) && (r.Messages[n].Role == "system" || r.Messages[n].Role == "developer") {
		n++
	}
	if n == 0 {
		return 0
	}
	k.msgs = k.msgs[:0]
	for _, m := range r.Messages[:n] {
		k.msgs = append(k.msgs, prompt.Message{Role: m.Role, Content: m.Content})
	}
	k.buf = prompt.Chat(k.buf[:0], k.msgs)
	return prompt.InstructionsKey(k.buf, len(k.buf), k.est)
}

// Of returns r's prefix key.
func (k *Keys) Of(r *trace.Request) uint64 {
	if len(r.Messages) > 0 {
		k.buf = appendPrefixText(k.buf[:0], r, k.est)
		return prompt.PrefixKey(k.buf, k.est)
	}
	b := firstBlockOf(r, k.est)
	if key, ok := k.seen[b]; ok {
		return key
	}
	k.buf = appendPrefixText(k.buf[:0], r, k.est)
	key := prompt.PrefixKey(k.buf, k.est)
	k.seen[b] = key
	return key
}
