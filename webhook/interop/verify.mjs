// Verifies one Standard Webhooks delivery with the npm library
// standardwebhooks (Webhook.verify: the signature, and the timestamp within
// its 5-minute tolerance of now), for the Go test that checks Replayguard's
// signer (webhook/interop_test.go). Reads from stdin:
//   {"secret": "whsec_…", "headers": {"name": "value"}, "body": "<UTF-8 string>"}
// and exits 0 only when the delivery verifies.
import { Webhook } from 'standardwebhooks';

const chunks = [];
for await (const c of process.stdin) chunks.push(c);
const req = JSON.parse(Buffer.concat(chunks).toString('utf8'));
try {
  new Webhook(req.secret).verify(req.body, req.headers, { jsonParse: false });
} catch (e) {
  process.stderr.write(`not verified: ${e.message}\n`);
  process.exit(1);
}
process.stdout.write('verified\n');
