// Express, with its default options, as the app behind the gateway:
// routing is case-insensitive and not strict (a trailing slash is
// optional), so it serves /ORDERS and /orders/ as POST /orders and
// /Admin/x under /admin. Its protected handlers, POST /orders and
// everything under /admin, answer 201 with X-App-Handler (orders or
// admin) and X-App-Runs (how many times a protected handler ran); every
// other request gets 404 with X-App-Handler: none. It prints its port on
// stdout once it listens.
import express from 'express';

const app = express();
let runs = 0;
const handler = (name) => (req, res) => {
  runs++;
  res.set({ 'X-App-Handler': name, 'X-App-Runs': String(runs) }).status(201).send(`${name} ran\n`);
};
app.post('/orders', handler('orders'));
app.use('/admin', handler('admin'));
app.use((req, res) => {
  res.set('X-App-Handler', 'none').status(404).send('no route\n');
});
const server = app.listen(0, '127.0.0.1', (err) => {
  if (err) {
    throw err;
  }
  process.stdout.write(`${server.address().port}\n`);
});
