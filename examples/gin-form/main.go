// Command gin-form is a tiny Gin application whose comment form is
// protected by Replayguard: every rendering of the form carries a
// single-use token in a hidden field, so a double click, a browser
// "resubmit" or a replayed request posts the comment once only. It works
// without JavaScript.
//
// Run it with
//
//	go run ./examples/gin-form
//
// and open http://127.0.0.1:8081/. It keeps its tokens in the embedded
// memory store and signs them with a random key, unless
// REPLAYGUARD_SIGNING_KEYS is set. It also mounts the token API
// (POST /v1/tokens, POST /v1/tokens/redeem) for JavaScript clients.
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

	"github.com/gin-gonic/gin"

	"github.com/replayguard/replayguard/guard"
	"github.com/replayguard/replayguard/handlers"
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
<p>Press the browser's back button and post the same form again: it is refused.</p>
<p><a href="/">Back to the comments</a></p>
{{end}}
{{define "refused"}}<!doctype html>
<title>Not posted</title>
<p>{{.}}</p>
<p><a href="/">Back to the comments</a></p>
{{end}}`))

func main() {
	addr := flag.String("addr", "127.0.0.1:8081", "listen address")
	flag.Parse()

	st := memory.New()
	defer st.Close()
	app, err := newApp(st, os.Getenv("REPLAYGUARD_SIGNING_KEYS"))
	if err != nil {
		log.Print(err)
		return
	}
	srv := &http.Server{Addr: *addr, Handler: app, ReadHeaderTimeout: 5 * time.Second}
	log.Printf("gin-form: open http://%s/", *addr)
	if err := srv.ListenAndServe(); err != nil {
		log.Print(err)
	}
}

// newApp returns the application's handler over st. keySpec is a
// REPLAYGUARD_SIGNING_KEYS value; empty means a random key.
func newApp(st *memory.Store, keySpec string) (http.Handler, error) {
	svc, err := newService(st, keySpec)
	if err != nil {
		return nil, err
	}
	var (
		mu       sync.Mutex
		comments []string
	)

	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	_ = r.SetTrustedProxies(nil) // client IPs (for the issue rate) are peer addresses
	r.Use(gin.Recovery())
	r.SetHTMLTemplate(pages)

	// The token API, for pages that fetch tokens with JavaScript.
	handlers.Mount(r, svc, handlers.WithIssueRate(st, handlers.DefaultIssueRate))

	// Refused forms get an HTML page instead of problem+json.
	errorPage := guard.WithErrorHandler(http.HandlerFunc(refused))

	r.GET("/", func(c *gin.Context) {
		// Every rendering gets a fresh token.
		field, err := guard.Field(c.Request, svc, purpose)
		if err != nil {
			problem.Write(c.Writer, err) // store full or unavailable
			return
		}
		mu.Lock()
		list := append([]string(nil), comments...)
		mu.Unlock()
		c.Header("Cache-Control", "no-store") // a cached page would carry a spent token
		c.HTML(http.StatusOK, "form", gin.H{"Field": field, "Comments": list})
	})

	// The handler runs only after the token was redeemed, exactly once.
	r.POST("/comments", guard.Gin(guard.RequireToken(svc, purpose, errorPage)), func(c *gin.Context) {
		text := c.PostForm("text")
		mu.Lock()
		comments = append(comments, text)
		mu.Unlock()
		c.HTML(http.StatusOK, "posted", text)
	})
	return r, nil
}

// newService builds the token service: one instance, machine ID 1.
func newService(st *memory.Store, keySpec string) (*token.Service, error) {
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
	return token.New(st, keys, token.WithMachineID(1))
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
