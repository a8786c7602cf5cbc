package lifecycle

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/gorgo-llm/gorgo/internal/tenant"
	"github.com/gorgo-llm/gorgo/internal/wire"
)

// Incoming is a request as a front end received it.
type Incoming struct {
	// Body is the request body; Kind says what it is.
	Body []byte
	Kind Kind
	// Session is the client's session header (empty if none).
	Session string
	// RequestID is the client's X-Request-Id header, which vLLM's engine
	// knows the request by (empty if none). LogID is the id the client is
	// answered with (its own, or one the front end made, MadeID): the
	// access log names the request by it.
	RequestID, LogID string
	MadeID           bool
	// Received is when the request arrived.
	Received time.Time
	// Allowed, if set, restricts the decision to the replicas it accepts (a
	// gateway's subset hint).
	Allowed func(id string) bool
	// Endpoint is the path the request was sent to ("/generate"): the
	// router passes over the replicas that answered they have no such
	// route (AttemptError.NoEndpoint).
	Endpoint string
	// Stored is the id of the Responses API response the request is about,
	// named in its path (/v1/responses/{id}/cancel through a gateway; the
	// proxy forwards a cancel itself): its first attempt goes to the
	// replica that stored it, as a responses request's
	// previous_response_id's does.
	Stored string
	// Parent is the client's trace context (a W3C traceparent), read by a
	// front end when the core traces requests (Core.Tracing).
	Parent trace.SpanContext
	// Tenant names whose request it is (an API key's name, a trusted
	// gateway's header; "": the default tenant) and Ask is what it asks
	// for in its headers. Header, if set, takes headers for the answer or
	// the refusal (the tenant's x-ratelimit-* budgets): a proxy's
	// http.Header does.
	Tenant string
	Ask    tenant.Ask
	Header HeaderSetter
	// Unseen says the front end will not see the answer's events (a
	// gateway that sends no response body): the router then treats the
	// answer as not streamed (policy.Request.Unstreamed), as for a body
	// that asks for no stream.
	Unseen bool
	// GatewaySends says a gateway sends the request and its fallbacks (an
	// endpoint picker's): an attempt after the first is one the gateway
	// already made, which a client's abort that came meanwhile does not
	// end here.
	GatewaySends bool
}

// HeaderSetter takes a header for the client's answer.
type HeaderSetter interface {
	Set(name, value string)
}

// A FrontEnd is what differs between gorgo's front ends: how an attempt
// reaches a replica, how its answer reaches the client, and how a refusal
// does. Serve calls it from its own goroutine, in the request's order:
// Send for each attempt until one is answered, then Relay once; or Refuse.
type FrontEnd interface {
	// Send makes the attempt of r on replica id: it sends the request (a
	// proxy) or names the replica to the gateway that will (an endpoint
	// picker), and returns once the replica's answer has begun, with its
	// HTTP status; or the reason the attempt failed, before anything
	// reached the client: then the next fallback is tried.
	Send(ctx context.Context, r *Request, id string) (status int, err *AttemptError)
	// Relay passes the answer on to the client, handing its events to r
	// (Chunk, Done, Complete), and says how it ended.
	Relay(r *Request) Outcome
	// Refuse answers the client with e: no replica will serve the request.
	Refuse(e *wire.Error)
}

// AttemptError is why an attempt failed before anything reached the
// client.
type AttemptError struct {
	// Error is what the client is told if no other replica serves it.
	wire.Error
	// Broken says the replica is to blame (it refused, hung, broke, or
	// answered 5xx): it counts against its health. A busy replica (503,
	// 429) is not broken.
	Broken bool
	// ModelMissing says the replica answered 404 for the model: it does
	// not serve it (any more). Not broken: the replica loses the model,
	// and the next fallback is tried.
	ModelMissing bool
	// NotHeld says the replica answered 404 to a request that names a
	// stored response (Request.Names): it does not hold it, and another
	// may. Not broken; the next fallback is tried, and an earlier
	// attempt's error (a busy holder's 503) is what the client hears if
	// none serves it.
	NotHeld bool
	// Busy says the replica answered that it is busy (503 or 429), and
	// Error.RetryAfter holds its Retry-After: not broken; the router
	// passes it over for that long (Router.Busy), and the next fallback is
	// tried.
	Busy bool
	// NoEndpoint says the replica has no route for the request's path (its
	// server's own 404: an engine without the API, as vLLM is without
	// SGLang's /generate, in a fleet of both): not broken; the router
	// passes it over for that endpoint for a while (Router.Lacks), and the
	// next fallback is tried.
	NoEndpoint bool
}

// Serve drives one request through its life: it reads the body, applies
// admission, asks the router for a replica, has the front end send each
// attempt until a replica answers (the next fallback after each failure,
// up to MaxAttempts), has it relay the answer, and ends the request (the
// ledger, the router's models, health, the learner, metrics, the live view
// and the access log). ctx is the client's: a client that leaves before an
// answer began is a 499 that does not count against any replica. It
// returns the status the request ended with.
func (c *Core) Serve(ctx context.Context, in Incoming, fe FrontEnd) int {
	r, e := c.begin(in.Body, in.Kind, in.Session, in.Received, false)
	if e != nil {
		c.Refused(e, in.LogID)
		fe.Refuse(e)
		return e.Status
	}
	id := in.RequestID
	if id == "" && r.Parsed.RequestID == "" && in.MadeID && (r.kind == Chat || r.kind == Completion) {
		// The client named it nowhere: the replica is sent the id the
		// client is answered with, so that the engine knows it (its
		// logs, an abort by id) as the client and the access log do.
		// Only a chat's or a completion's, whose body's request_id is
		// read (another body's, which the engine might take the header
		// over, is not).
		id, r.sendID = in.LogID, in.LogID
	}
	r.readEngineIDs(id)
	r.logID = in.LogID
	r.Route.Allowed, r.Route.Tenant, r.Route.Endpoint = in.Allowed, in.Tenant, in.Endpoint
	stored := r.Parsed.PreviousResponseID
	if stored == "" {
		stored = in.Stored
	}
	r.named = stored
	r.pin(stored, in.Allowed)
	r.Route.Unstreamed = r.Route.Unstreamed || in.Unseen
	r.reranked = in.GatewaySends // its later attempts are the gateway's, from the list it was given
	if e := r.classify(&in, time.Now()); e != nil {
		if e.Status == statusBadRequest && r.tenant != nil {
			c.cfg.Metrics.tenantRefused(r.tenant.Name, r.class.Priority, "bad_request")
		}
		r.reject(e)
		fe.Refuse(e)
		return e.Status
	}
	r.Route.HasSLO, r.Route.Unjudged = r.slos().HasSLO(), !r.generates() || in.Unseen && r.Parsed.Stream
	r.traceStart(ctx, in.Parent, in.Kind)
	e, gone := r.admit(ctx)
	r.traceQueue(e, gone)
	if gone == errAborted {
		return r.endAborted(fe)
	} else if gone != nil {
		r.abandon()
		return statusClientGone
	} else if e != nil {
		r.reject(e)
		fe.Refuse(e)
		return e.Status
	}
	for {
		id, ok := r.next()
		if !ok {
			break
		}
		if (r.sent.IsZero() || !in.GatewaySends) && r.abortable() && r.ClientAborted(time.Now()) {
			// Aborted since it left the queue, or since its last attempt
			// failed: the abort may have passed its next replica already.
			return r.endAborted(fe)
		}
		r.sendAt(time.Now())
		r.traceAttempt(id)
		status, aerr := fe.Send(ctx, r, id)
		r.traceSent(status, aerr)
		if aerr != nil {
			if ctx.Err() != nil { // the client left: not the replica's fault
				r.abandon()
				return statusClientGone
			}
			r.failed(aerr)
			continue
		}
		if status == statusOK {
			r.accepted()
		}
		return r.end(fe.Relay(r), time.Now())
	}
	e = r.failure()
	if r.attempts > 0 {
		// Dispatched, and failed on every replica it was tried on: a
		// failed request of the arm that routed it.
		r.learn(e.Status, time.Now())
	}
	r.reject(e)
	fe.Refuse(e)
	return e.Status
}

// sendAt records an attempt sent at. The router's models time the
// replica that answered from its own attempt (its round trip and its
// engine); the learner times the arm that routed the request from the
// first: an attempt its weights sent to a replica that hung, or refused,
// cost the client that time before the fallback answered, and the
// fallbacks are the same decision's, so of the same arm.
func (r *Request) sendAt(at time.Time) {
	r.sent = at
	if r.dispatched.IsZero() {
		r.dispatched = at
	}
}

// Refused counts a request refused before it was read (its body was too
// large or broke off, or could not be read as its kind), as Serve counts
// those it refuses, and writes its access log line, which names it by
// logID (Incoming.LogID; a user's test: a client's id of such a request
// was in no line).
func (c *Core) Refused(e *wire.Error, logID string) {
	model := ""
	if e.Code == wire.CodeModelNotFound {
		model = otherModel
	}
	c.cfg.Metrics.ended("", model, e.Status, noTTFT, 0)
	if c.cfg.Log != nil {
		attrs := []any{"replica", "", "status", e.Status, "error", e.Message}
		if logID != "" {
			attrs = append(attrs, "request_id", logID)
		}
		c.cfg.Log.Info("request", attrs...)
	}
}

// DryRun reads a chat request without serving it, to explain where it
// would go (its Route); Discard it after.
func (c *Core) DryRun(body []byte, session string) (*Request, *wire.Error) {
	return c.begin(body, Chat, session, time.Now(), true)
}
