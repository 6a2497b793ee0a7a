// Signs one webhook delivery with the provider's own npm library, for the Go
// tests (webhook/interop_test.go, test/webhook) that prove Replayguard accepts
// what the providers send. Reads from stdin:
//   {"scheme": "standard" | "stripe" | "github", "secret": "...", "id": "...",
//    "timestamp": <unix seconds>, "body": "<the payload, a UTF-8 string>",
//    "url": "http://127.0.0.1:…/…"? (send the delivery there with fetch)}
// and prints {"headers": {"name": "value"}} (with "url": also "status" and
// "response", the answer's status and body, and "replayed", its
// Idempotent-Replayed header).
//   standard: standardwebhooks' Webhook.sign (webhook-id, webhook-timestamp,
//             webhook-signature);
//   stripe:   stripe's webhooks.generateTestHeaderString (Stripe-Signature);
//   github:   @octokit/webhooks-methods' sign (X-Hub-Signature-256), with
//             "id" as X-GitHub-Delivery.
// Slack publishes no signing library of its own: its documented test vector
// covers it (webhook/vectors_test.go).
import { Webhook } from 'standardwebhooks';
import Stripe from 'stripe';
import { sign } from '@octokit/webhooks-methods';

const chunks = [];
for await (const c of process.stdin) chunks.push(c);
const req = JSON.parse(Buffer.concat(chunks).toString('utf8'));

const headers = {};
switch (req.scheme) {
  case 'standard':
    headers['webhook-id'] = req.id;
    headers['webhook-timestamp'] = String(req.timestamp);
    headers['webhook-signature'] = new Webhook(req.secret).sign(req.id, new Date(req.timestamp * 1000), req.body);
    break;
  case 'stripe':
    headers['Stripe-Signature'] = Stripe.webhooks.generateTestHeaderString({
      payload: req.body, secret: req.secret, timestamp: req.timestamp
    });
    break;
  case 'github':
    headers['X-GitHub-Delivery'] = req.id;
    headers['X-GitHub-Event'] = 'push';
    headers['X-Hub-Signature-256'] = await sign(req.secret, req.body);
    break;
  default:
    process.stderr.write(`unknown scheme ${req.scheme}\n`);
    process.exit(2);
}
headers['Content-Type'] = 'application/json';
const result = { headers };
if (req.url) {
  const res = await fetch(req.url, { method: 'POST', headers, body: req.body, redirect: 'manual' });
  Object.assign(result, {
    status: res.status, response: await res.text(), replayed: res.headers.get('idempotent-replayed') || ''
  });
}
process.stdout.write(JSON.stringify(result) + '\n');
