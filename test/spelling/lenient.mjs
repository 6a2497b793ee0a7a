// An app behind the gateway whose hand-written router reads paths as
// leniently as any framework or server does, each step one that some of
// them take:
//
//   - it percent-decodes the whole target until nothing changes (servers
//     that decode twice), reading the bytes as UTF-8 leniently: an
//     overlong form such as %c0%af is / (IIS, old Java decoders);
//   - it normalises to NFKC (／ is /, ｏ is o) and lowercases;
//   - it reads \ as / (Windows, WHATWG URL) and drops ;parameters from
//     segments (Tomcat, Jetty);
//   - it ends the path at the first ? or # of the decoded target;
//   - it resolves . and .., drops trailing dots and spaces from segments
//     (Windows) and empty segments (a trailing slash, as Express), and a
//     .ext suffix from the last one (Rails' format).
//
// Its protected handlers, POST /orders and every request under /admin,
// answer 201 with X-App-Handler (orders or admin), X-App-Path (the path
// it read) and X-App-Runs (how many times a protected handler ran); every
// other request gets 404 with X-App-Handler: none. It uses no package
// and prints its port on stdout once it listens.
import http from 'node:http';

// percentDecode decodes every valid %XX escape of bytes.
function percentDecode(bytes) {
  const out = [];
  const hex = (c) => /[0-9a-fA-F]/.test(String.fromCharCode(c));
  for (let i = 0; i < bytes.length; i++) {
    if (bytes[i] === 0x25 && i + 2 < bytes.length && hex(bytes[i + 1]) && hex(bytes[i + 2])) {
      out.push(parseInt(String.fromCharCode(bytes[i + 1], bytes[i + 2]), 16));
      i += 2;
    } else {
      out.push(bytes[i]);
    }
  }
  return out;
}

// lenientUTF8 reads bytes as UTF-8 without checking for overlong forms:
// C0 AF is U+002F. Other broken sequences become U+FFFD.
function lenientUTF8(bytes) {
  let out = '';
  const cont = (i) => i < bytes.length && (bytes[i] & 0xc0) === 0x80;
  for (let i = 0; i < bytes.length; ) {
    const b = bytes[i];
    let cp = 0xfffd;
    let n = 1;
    if (b < 0x80) {
      cp = b;
    } else if (b >= 0xc0 && b < 0xe0 && cont(i + 1)) {
      cp = ((b & 0x1f) << 6) | (bytes[i + 1] & 0x3f);
      n = 2;
    } else if (b >= 0xe0 && b < 0xf0 && cont(i + 1) && cont(i + 2)) {
      cp = ((b & 0x0f) << 12) | ((bytes[i + 1] & 0x3f) << 6) | (bytes[i + 2] & 0x3f);
      n = 3;
    } else if (b >= 0xf0 && b < 0xf8 && cont(i + 1) && cont(i + 2) && cont(i + 3)) {
      cp = ((b & 0x07) << 18) | ((bytes[i + 1] & 0x3f) << 12) | ((bytes[i + 2] & 0x3f) << 6) | (bytes[i + 3] & 0x3f);
      n = 4;
    }
    out += String.fromCodePoint(cp > 0x10ffff ? 0xfffd : cp);
    i += n;
  }
  return out;
}

// read is the path the router reads in target (req.url: its bytes as
// latin1).
function read(target) {
  let s = lenientUTF8(percentDecode(Buffer.from(target, 'latin1')));
  for (let i = 0; i < 8 && /%[0-9a-fA-F]{2}/.test(s); i++) {
    s = lenientUTF8(percentDecode(Buffer.from(s, 'utf8')));
  }
  s = s.normalize('NFKC').toLowerCase().replace(/\\/g, '/').split(/[?#]/)[0];
  const segs = [];
  for (let seg of s.split('/')) {
    seg = seg.split(';')[0];
    if (seg === '..') {
      segs.pop();
      continue;
    }
    seg = seg.replace(/[. ]+$/, '');
    if (seg !== '') {
      segs.push(seg);
    }
  }
  if (segs.length > 0) {
    const last = segs[segs.length - 1];
    const dot = last.indexOf('.', last.match(/^\.*/)[0].length);
    if (dot > 0) {
      segs[segs.length - 1] = last.slice(0, dot).replace(/[. ]+$/, '');
    }
  }
  return '/' + segs.join('/');
}

let runs = 0;
// safeHeader is path as a header value: encodeURI refuses lone
// surrogates, which lenient decoding can make.
function safeHeader(path) {
  try {
    return encodeURI(path);
  } catch {
    return 'unencodable';
  }
}

const server = http.createServer((req, res) => {
  const path = read(req.url);
  let name = 'none';
  if (req.method === 'POST' && path === '/orders') {
    name = 'orders';
  } else if (path === '/admin' || path.startsWith('/admin/')) {
    name = 'admin';
  }
  const headers = { 'X-App-Handler': name, 'X-App-Path': safeHeader(path), 'Content-Type': 'text/plain' };
  if (name === 'none') {
    res.writeHead(404, headers);
    res.end('no route\n');
    return;
  }
  runs++;
  res.writeHead(201, { ...headers, 'X-App-Runs': String(runs) });
  res.end(`${name} ran\n`);
});
server.listen(0, '127.0.0.1', () => {
  process.stdout.write(`${server.address().port}\n`);
});
