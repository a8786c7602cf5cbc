package wire

// Format is how a replica writes its answers: the OpenAI API's (OpenAI),
// or SGLang's native one, POST /generate (Native). A relay reads each
// answer through its request's Format.
type Format interface {
	// Chunk reads one streamed event's data (not [DONE]).
	Chunk(data []byte) Peek
	// Body reads a whole answer's completion and cached prompt tokens
	// (-1 when not reported); Tail the same from the last bytes of one
	// too long to hold.
	Body(body []byte) (completionTokens, cachedTokens int)
	Tail(tail []byte) (completionTokens, cachedTokens int)
	// AbortedUnanswered reports whether a whole answer says the engine
	// gave the request up before its first token.
	AbortedUnanswered(body []byte) bool
	// RequestFault reports whether a streamed error event blames the
	// request, not the replica.
	RequestFault(data []byte) bool
}

// The formats.
var (
	OpenAI Format = openAI{}
	Native Format = native{}
)

type openAI struct{}

func (openAI) Chunk(data []byte) Peek             { return PeekChunk(data) }
func (openAI) Body(body []byte) (int, int)        { return PeekBody(body) }
func (openAI) Tail(tail []byte) (int, int)        { return PeekTail(tail) }
func (openAI) AbortedUnanswered(body []byte) bool { return AbortedUnanswered(body) }
func (openAI) RequestFault(data []byte) bool      { return RequestFault(data) }

type native struct{}

func (native) Chunk(data []byte) Peek             { return PeekNative(data) }
func (native) Body(body []byte) (int, int)        { return PeekNativeBody(body) }
func (native) Tail(tail []byte) (int, int)        { return PeekNativeTail(tail) }
func (native) AbortedUnanswered(body []byte) bool { return NativeAbortedUnanswered(body) }

// RequestFault: SGLang's native stream carries an error only for a
// ValueError of the request's validation (a prompt past the context, bad
// sampling params; its http_server.py answers the same unstreamed with a
// 400), as {"error":{"message":...}} with no code.
func (native) RequestFault([]byte) bool { return true }
