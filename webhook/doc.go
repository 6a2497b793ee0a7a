// Package webhook verifies the signed deliveries that webhook providers
// send (Standard Webhooks and Svix, Stripe, GitHub, Slack) and signs
// Standard Webhooks deliveries for services that send them.
//
// A Verifier checks one scheme over the raw body, exactly as the provider
// specifies, against one or more secrets (any one verifies, so a secret
// can be rotated without downtime), compares signatures in constant time,
// checks the signed timestamp against a window (5 minutes either side by
// default; GitHub signs no time) and returns the Delivery with the ID the
// delivery runs once under:
//
//	scheme    signature header                    signed content          key
//	standard  webhook-signature: v1,… / v1a,…     id.timestamp.body       webhook-id
//	stripe    Stripe-Signature: t=…,v1=…          t.body                  the event's "id"
//	github    X-Hub-Signature-256: sha256=…       body                    X-GitHub-Delivery
//	slack     X-Slack-Signature: v0=…             v0:timestamp:body       the body's event_id (Events API), else the X-Slack-Signature value
//
// Verification touches no store: running each delivery once is the job of
// guard.RequireWebhook, which verifies first and only then opens the
// delivery's record in an idempotency.Keeper, so a forged delivery never
// reaches the store. The gateway's webhook policy does the same in front
// of an app in any language.
//
// # Example
//
// A Stripe endpoint that runs each event once, however often Stripe
// delivers it:
//
//	v, err := webhook.New(webhook.Stripe, []string{os.Getenv("STRIPE_WEBHOOK_SECRET")})
//	if err != nil {
//		return err // names the secret by position, never by value
//	}
//	keeper := idempotency.New(st) // st: a store/redis Store, say
//	mux.Handle("POST /hooks/stripe", guard.RequireWebhook(v, keeper)(
//		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
//			d, _ := guard.WebhookFrom(r.Context()) // d.ID is the event's id
//			if err := fulfil(r.Context(), d.ID, r.Body); err != nil {
//				http.Error(w, "try again", http.StatusInternalServerError) // released: Stripe's retry runs
//				return
//			}
//			w.WriteHeader(http.StatusNoContent) // stored: redeliveries get it again
//		})))
//
// A service that sends Standard Webhooks signs each delivery with a
// Signer, keeping the ID across redeliveries (package guard's
// ExampleRequireWebhook runs a receiver and this sender together):
//
//	secret, _ := webhook.GenerateSecret() // give it to the receiver once
//	signer, err := webhook.NewSigner([]string{secret})
//	...
//	req, _ := http.NewRequest(http.MethodPost, endpoint, bytes.NewReader(payload))
//	err = signer.SignRequest(req, eventID) // webhook-id, webhook-timestamp, webhook-signature
//
// # Clocks and restarts
//
// The window is checked with the Verifier's clock (WithClock), the
// server's. A store that forgets its records on restart (the memory
// store) could let a delivery that ran before the restart run again while
// it is still inside its window: WithNotBefore(process start) refuses
// deliveries timestamped before it. GitHub deliveries, which carry no
// time, are never refused for age.
package webhook
