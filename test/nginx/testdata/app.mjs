// An app that reads its requests as Node.js's WHATWG URL parser does
// (new URL), as many Node frameworks do: it resolves dot segments,
// including %2e, and reads a backslash as a slash. It takes the host
// from X-Forwarded-Host, as an app behind a proxy that trusts it does.
// It answers every request it can read with 201 and what it read, in
// X-App-Host and X-App-Path, and prints its port on stdout.
import http from 'node:http';

const server = http.createServer((req, res) => {
  let url;
  try {
    url = new URL(req.url, 'http://' + (req.headers['x-forwarded-host'] ?? req.headers.host ?? 'localhost'));
  } catch {
    res.writeHead(400, { 'Content-Type': 'text/plain' });
    res.end('unreadable\n');
    return;
  }
  res.writeHead(201, { 'X-App-Host': url.hostname, 'X-App-Path': url.pathname, 'Content-Type': 'text/plain' });
  res.end('app ran\n');
});
server.listen(0, '127.0.0.1', () => {
  process.stdout.write(server.address().port + '\n');
});
