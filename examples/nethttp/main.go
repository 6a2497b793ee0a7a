// Command nethttp is the gin-form example with the standard library only:
// a comment form rendered with a single-use token in a hidden field, and
// a POST route wrapped in guard.RequireToken, so each rendering of
// the form is posted at most once.
//
// Run it with
//
//	go run ./examples/nethttp
//
// and open http://127.0.0.1:8082/. It keeps its tokens in the embedded
// memory store and signs them with a random key, unless
// REPLAYGUARD_SIGNING_KEYS is set.
package main

import (
	"errors"
	"flag"
	"html/template"
	"log"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/replayguard/replayguard/guard"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/token"
)

// purpose is what the form's tokens are issued and redeemed for.
const purpose = "comment"

var pages = template.Must(template.New("pages").Parse(`
{{define "form"}}<!doctype html>
<title>Comments</title>
<h1>Comments</h1>
<ul>{{range .Comments}}<li>{{.}}</li>{{else}}<li>No comments yet.</li>{{end}}</ul>
<form method="post" action="/comments">
  {{.Field}}
  <input name="text" required placeholder="Say something">
  <button>Post</button>
</form>
{{end}}
{{define "posted"}}<!doctype html>
<title>Posted</title>
<p>Thanks, your comment was posted: {{.}}</p>
<p><a href="/">Back to the comments</a></p>
{{end}}
{{define "refused"}}<!doctype html>
<title>Not posted</title>
<p>{{.}}</p>
<p><a href="/">Back to the comments</a></p>
{{end}}`))

func main() {
	addr := flag.String("addr", "127.0.0.1:8082", "listen address")
	flag.Parse()

	st := memory.New()
	defer st.Close()
	app, err := newApp(st, os.Getenv("REPLAYGUARD_SIGNING_KEYS"))
	if err != nil {
		log.Print(err)
		return
	}
	srv := &http.Server{Addr: *addr, Handler: app, ReadHeaderTimeout: 5 * time.Second}
	log.Printf("nethttp: open http://%s/", *addr)
	if err := srv.ListenAndServe(); err != nil {
		log.Print(err)
	}
}

// app holds the comments posted so far.
type app struct {
	tokens   *token.Service
	mu       sync.Mutex
	comments []string
}

// newApp returns the application's handler over st. keySpec is a
// REPLAYGUARD_SIGNING_KEYS value; empty means a random key.
func newApp(st *memory.Store, keySpec string) (http.Handler, error) {
	var keys []token.Key
	if keySpec != "" {
		var err error
		if keys, err = token.ParseKeys(keySpec); err != nil {
			return nil, err
		}
	} else {
		k, err := token.GenerateKey()
		if err != nil {
			return nil, err
		}
		keys = []token.Key{k}
	}
	svc, err := token.New(st, keys, token.WithMachineID(1))
	if err != nil {
		return nil, err
	}
	a := &app{tokens: svc}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", a.form)
	// post runs only after the token was redeemed, exactly once; refused
	// forms get an HTML page instead of problem+json.
	protect := guard.RequireToken(svc, purpose, guard.WithErrorHandler(http.HandlerFunc(refused)))
	mux.Handle("POST /comments", protect(http.HandlerFunc(a.post)))
	return mux, nil
}

func (a *app) form(w http.ResponseWriter, r *http.Request) {
	field, err := guard.Field(r, a.tokens, purpose) // a fresh token per rendering
	if err != nil {
		problem.Write(w, err) // store full or unavailable
		return
	}
	a.mu.Lock()
	list := append([]string(nil), a.comments...)
	a.mu.Unlock()
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store") // a cached page would carry a spent token
	_ = pages.ExecuteTemplate(w, "form", map[string]any{"Field": field, "Comments": list})
}

func (a *app) post(w http.ResponseWriter, r *http.Request) {
	text := r.PostFormValue("text")
	a.mu.Lock()
	a.comments = append(a.comments, text)
	a.mu.Unlock()
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_ = pages.ExecuteTemplate(w, "posted", text)
}

// refused renders the page for a form RequireToken refused, with the
// problem's status (409 for a replay).
func refused(w http.ResponseWriter, r *http.Request) {
	reason := guard.FailureReason(r)
	msg := "This form could not be accepted. Reload the page and try again."
	switch {
	case errors.Is(reason, token.ErrUsed):
		msg = "This form was already posted; it is not posted twice."
	case errors.Is(reason, token.ErrExpired):
		msg = "This form has expired. Reload the page and post it again."
	case errors.Is(reason, store.ErrUnavailable), errors.Is(reason, store.ErrFull):
		msg = "We could not check this form just now, so it was not posted. Try again in a moment."
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(problem.For(reason).Status)
	_ = pages.ExecuteTemplate(w, "refused", msg)
}
