package guard

import "net/http"

// SeeOther answers a request that succeeded — typically the POST of a
// protected form — with 303 See Other to url, the page that shows its
// result: Post-Redirect-Get. The browser follows with a GET, so the history
// entry the user ends on is that GET: Reload shows the result again instead
// of offering to resend the form, and Back returns to the form page, never
// to the POST. (ReplayGuard.submit in the browser SDK goes one step further
// and replaces the form page's entry with url.) Should the form be sent
// once more anyway, its spent token gets it refused with token_used.
//
// url is an absolute URL or a path; a relative path is resolved against the
// request's path, as http.Redirect does. It must be built by the
// application, never copied from the request, or SeeOther becomes an open
// redirect. The answer carries Cache-Control: no-store, so no cache keeps
// a redirect that belongs to one submission, and no body.
//
// With Gin, call it as guard.SeeOther(c.Writer, c.Request, url).
func SeeOther(w http.ResponseWriter, r *http.Request, url string) {
	w.Header().Set("Cache-Control", "no-store")
	// http.Redirect writes a short HTML body for GET and HEAD only; the
	// POST a PRG redirect answers gets none.
	http.Redirect(w, r, url, http.StatusSeeOther)
}
