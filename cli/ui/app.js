// roster's service map: reads this agent's HTTP API (docs/reference/http.md) as any client
// does, and follows its event streams. Plain JavaScript, no build step, no dependencies.

const STATUSES = ['passing', 'warning', 'critical', 'maintenance', 'unreachable'];
/** The most changes the Changes view keeps. */
const MAX_CHANGES = 500;
/** How long a blocking query on the summary waits before it is asked again. */
const SUMMARY_WAIT = '60s';
/** How long a fresh stream is quiet before what it did not send is dropped. */
const QUIET_MS = 500;
/** What a service's list reads of each instance: what its rows show and its filters match. */
const ROW_FIELDS = 'instance,address,status,meta,node';
/** How often the Members view reads again while it is shown. */
const MEMBERS_EVERY_MS = 5000;

const $ = (sel) => document.querySelector(sel);
const view = $('#view');
const enc = encodeURIComponent;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
/** Reconnect delays as `roster watch` takes them: doubling from 250 ms to 10 s, jittered. */
const backoff = (n) => Math.min(10000, 250 * 2 ** n) * (0.75 + Math.random() / 2);

/** An element: `h('a', {href: '#/x', class: 'row'}, 'text', child)`. Text is never parsed as HTML. */
function h(tag, props = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (v === true) e.setAttribute(k, '');
    else if (v !== false && v != null) e.setAttribute(k, v);
  }
  e.append(...kids.flat().filter((k) => k != null && k !== false));
  return e;
}

const state = {
  summary: null,
  changes: [],
  nodes: new Map(), // node id -> name
  filters: { name: '', meta: '' },
};

// ---- Connection: "live", or unreachable and reconnecting.

const down = new Set();
function reach(source, ok) {
  if (ok) down.delete(source);
  else down.add(source);
  const el = $('#conn');
  el.textContent = down.size ? 'agent unreachable, reconnecting…' : 'live';
  el.className = down.size ? 'conn down' : 'conn live';
}

// ---- The API, with a bearer token when the agent asks for one (401).

let token = sessionStorage.getItem('roster-token') || '';
let asking = null;

function headers(extra = {}) {
  return token ? { ...extra, Authorization: `Bearer ${token}` } : extra;
}

/** Asks for a token once for every request that got a 401; whether one was given. */
function askToken() {
  asking ??= ask(
    'This agent needs a token (it answered 401). Give one of its --http-token-file; it is kept in this tab only.',
    { input: true, ok: 'Use token' },
  ).then((t) => {
    asking = null;
    if (!t) return false;
    token = t.trim();
    sessionStorage.setItem('roster-token', token);
    return true;
  });
  return asking;
}

/** A request to the API: its JSON body and index; throws the API's error message. */
async function api(path, opts = {}) {
  for (;;) {
    const r = await fetch(path, { ...opts, headers: headers(opts.headers) });
    if (r.status === 401 && (await askToken())) continue;
    const body = await r.json().catch(() => null);
    if (!r.ok) throw new Error(body?.error?.message || `the agent answered ${r.status}`);
    return { body, index: r.headers.get('x-roster-index') };
  }
}

/**
 * Follows an event stream until the returned function is called: `onEvent(kind, data)` for
 * each event. It reconnects with backoff, resuming with Last-Event-ID as EventSource does
 * (read with fetch, so it can send the token too). `onOpen(resumed)` on each connection.
 */
function follow(path, onEvent, onOpen) {
  let stopped = false;
  let abort = null;
  let last = null;
  (async () => {
    for (let tries = 0; !stopped; ) {
      const ac = new AbortController();
      abort = () => ac.abort();
      try {
        const hs = headers({ Accept: 'text/event-stream' });
        if (last) hs['Last-Event-ID'] = last;
        const r = await fetch(path, { headers: hs, signal: ac.signal });
        if (r.status === 401 && (await askToken())) continue;
        if (!r.ok) throw new Error(`the agent answered ${r.status}`);
        tries = 0;
        reach(path, true);
        onOpen?.(last !== null);
        last = await read(r.body, onEvent, last);
      } catch {
        // Unreachable, or the stream broke: reconnect below.
      }
      if (stopped) return;
      reach(path, false);
      await sleep(backoff(tries++));
    }
  })();
  return () => {
    stopped = true;
    abort?.();
    reach(path, true);
  };
}

/** Reads server-sent events off `body` until it ends; returns the last event id seen. */
async function read(body, onEvent, last) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let rest = '';
  let kind = 'message';
  let data = [];
  let id = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return last;
    const lines = (rest + value).split('\n');
    rest = lines.pop();
    for (const raw of lines) {
      const line = raw.endsWith('\r') ? raw.slice(0, -1) : raw;
      if (line === '') {
        // An event without an id: the agent's id would be too long (a large service), so
        // a reconnection starts afresh rather than from an older id.
        if (data.length) last = id;
        if (data.length) onEvent(kind, data.join('\n'));
        kind = 'message';
        data = [];
        id = null;
      } else if (line.startsWith('data:')) data.push(line.slice(5).trimStart());
      else if (line.startsWith('event:')) kind = line.slice(6).trim();
      else if (line.startsWith('id:')) id = line.slice(3).trim();
    }
  }
}

// ---- The summary, followed for the whole page with a blocking query.

async function followSummary() {
  let index = null;
  for (let tries = 0; ; ) {
    try {
      const q = index ? `?index=${enc(index)}&wait=${SUMMARY_WAIT}` : '';
      const r = await api(`/v1/summary${q}`);
      index = r.index;
      tries = 0;
      reach('summary', true);
      gotSummary(r.body);
    } catch {
      index = null;
      reach('summary', false);
      await sleep(backoff(tries++));
    }
  }
}

function gotSummary(list) {
  if (state.summary) {
    const before = new Map(state.summary.map((s) => [s.service, s]));
    for (const s of list) {
      const b = before.get(s.service);
      before.delete(s.service);
      const moved = STATUSES.filter((k) => (b?.[k] ?? 0) !== s[k]).map((k) => `${k} ${b?.[k] ?? 0} → ${s[k]}`);
      if (moved.length) note(s.service, moved.join(', '));
    }
    for (const name of before.keys()) note(name, 'no instances left');
  }
  state.summary = list;
  refresh.summary?.();
}

/** Adds a change to the Changes view, newest first. */
function note(what, text, status) {
  state.changes.unshift({ at: new Date(), what, text, status });
  state.changes.length = Math.min(state.changes.length, MAX_CHANGES);
  refresh.changes?.();
}

/** What the view shown wants redrawn when the summary or the changes move. */
const refresh = {};

async function loadNodes() {
  try {
    const { body } = await api('/v1/members');
    for (const m of body) state.nodes.set(m.node, m.name);
  } catch {
    // Names are a nicety: ids are shown until they come.
  }
}

const nodeName = (id) => state.nodes.get(id) ?? id;
const when = (t) => (t ? new Date(t).toLocaleString() : '');
/** A span as `roster members` shows one: `412 ms`, `27.1 s`, then whole minutes. */
const span = (ms) => (ms < 1000 ? `${ms} ms` : ms < 120000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.floor(ms / 60000)} min`);
const metaText = (m) => Object.entries(m || {}).map(([k, v]) => `${k}=${v}`).join(', ');

/** `key:value` as a pair, or null; throws a message saying what to type. */
function metaFilter(text) {
  const t = text.trim();
  if (!t) return null;
  const at = t.indexOf(':');
  if (at < 1) throw new Error('a metadata filter is key:value (e.g. zone:eu-1)');
  return [t.slice(0, at), t.slice(at + 1)];
}

function field(label, input) {
  return h('label', {}, label, input);
}

// ---- Services.

function showServices() {
  const name = h('input', { type: 'search', value: state.filters.name, placeholder: 'web', oninput: draw });
  const meta = h('input', { type: 'search', value: state.filters.meta, placeholder: 'zone:eu-1', oninput: draw });
  const rows = h('tbody');
  const caption = h('caption', { class: 'muted', 'aria-live': 'polite' });
  view.replaceChildren(
    h('h1', {}, 'Services'),
    h('div', { class: 'filters' }, field('Filter by name', name), field('Filter by metadata', meta)),
    h(
      'table',
      {},
      caption,
      h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Service'), h('th', { class: 'n', scope: 'col' }, 'Instances'),
        STATUSES.map((s) => h('th', { class: 'n', scope: 'col' }, s)))),
      rows,
    ),
  );
  let asked = 0;
  async function draw() {
    state.filters = { name: name.value, meta: meta.value };
    if (!state.summary) return;
    const mine = ++asked;
    let list = state.summary.filter((s) => s.service.toLowerCase().includes(name.value.trim().toLowerCase()));
    try {
      const pair = metaFilter(meta.value);
      if (pair) list = await withMeta(list, pair);
    } catch (e) {
      if (mine === asked) caption.textContent = e.message;
      return;
    }
    if (mine !== asked) return;
    caption.textContent = `${list.length} of ${state.summary.length} services`;
    rows.replaceChildren(...list.map((s) => h('tr', {},
      h('th', { scope: 'row' }, h('a', { href: `#/service/${enc(s.service)}` }, s.service)),
      h('td', { class: 'n' }, s.instances),
      STATUSES.map((k) => h('td', { class: s[k] ? `n ${k}` : 'n muted' }, s[k])))));
  }
  refresh.summary = draw;
  draw();
}

/** The services with instances that have `key:value`, counted from those instances. */
async function withMeta(list, [k, v]) {
  const q = `?all&meta=${enc(`${k}:${v}`)}`;
  const found = await Promise.all(list.map((s) => api(`/v1/services/${enc(s.service)}${q}`)));
  return list
    .map((s, i) => {
      const c = { service: s.service, instances: found[i].body.length };
      for (const st of STATUSES) c[st] = found[i].body.filter((x) => x.status === st).length;
      return c;
    })
    .filter((c) => c.instances > 0);
}

// ---- A service's instances: every one, rendered only where visible.

function showService(name) {
  const shown = new Map(); // id -> instance
  let order = []; // the ids of `shown`, sorted once `unsorted` is dealt with
  let unsorted = false;
  let removed = false;
  let list = []; // the ids shown: `order` through the filters
  let dirty = true;
  let queued = false;
  let focused = -1;
  const text = h('input', { type: 'search', placeholder: 'id, address or metadata', oninput: changed });
  const meta = h('input', { type: 'search', placeholder: 'zone:eu-1', oninput: changed });
  const status = h('select', { onchange: changed }, h('option', { value: '' }, 'any'), STATUSES.map((s) => h('option', { value: s }, s)));
  const count = h('p', { id: 'count', class: 'muted', 'aria-live': 'polite' }, 'loading…');
  const rows = h('div', { class: 'rows', role: 'rowgroup' });
  const spacer = h('div', { class: 'spacer' }, rows);
  const scroll = h('div', { class: 'scroll', onscroll: schedule, onkeydown: keys }, spacer);
  const head = h('div', { class: 'head', role: 'row' }, ['Instance', 'Address', 'Status', 'Metadata', 'Node'].map((c) => h('span', { role: 'columnheader' }, c)));
  view.replaceChildren(
    h('h1', {}, h('a', { href: '#/services' }, 'Services'), ' / ', name),
    h('div', { class: 'filters' }, field('Find', text), field('Metadata', meta), field('Status', status)),
    count,
    h('div', { class: 'grid', role: 'table', 'aria-label': `Instances of ${name}`, 'aria-rowcount': 0 }, head, scroll),
  );
  const rowHeight = () => parseFloat(getComputedStyle(rows).fontSize) * 2; // --row: 2rem

  function changed() {
    dirty = true;
    schedule();
  }
  function schedule() {
    if (queued) return;
    queued = true;
    requestAnimationFrame(paint);
  }
  /** The filter of the inputs, or null when they keep everything. */
  function matcher() {
    const t = text.value.trim().toLowerCase();
    let pair = null;
    try {
      pair = metaFilter(meta.value);
    } catch (e) {
      count.textContent = e.message;
    }
    if (!t && !pair && !status.value) return null;
    return (i) =>
      (!status.value || i.status === status.value) &&
      (!pair || i.meta?.[pair[0]] === pair[1]) &&
      (!t || i.instance.toLowerCase().includes(t) || i.address.includes(t) || metaText(i.meta).toLowerCase().includes(t));
  }
  /** Sorts and filters only when something asks for it: a stream sends ids in order. */
  function relist() {
    if (removed) order = order.filter((id) => shown.has(id));
    if (unsorted) order.sort();
    removed = unsorted = false;
    const m = matcher();
    list = m ? order.filter((id) => m(shown.get(id))) : order;
  }
  function paint() {
    queued = false;
    const rh = rowHeight();
    if (dirty) {
      dirty = false;
      relist();
      spacer.style.height = `${list.length * rh}px`;
      scroll.parentElement.setAttribute('aria-rowcount', list.length);
      count.textContent = `${list.length} of ${shown.size} instances`;
      if (count.dataset.count !== String(list.length)) count.dataset.countedAt = -1;
      count.dataset.count = list.length;
    }
    const first = Math.floor(scroll.scrollTop / rh);
    const n = Math.ceil(scroll.clientHeight / rh) + 1;
    rows.style.top = `${first * rh}px`;
    rows.replaceChildren(...list.slice(first, first + n).map((id, k) => row(shown.get(id), first + k)));
    rows.querySelector(`[data-i="${focused}"]`)?.focus();
    // For bench/ui: when the rows of the count shown were first drawn.
    if (count.dataset.countedAt === '-1') count.dataset.countedAt = Math.round(performance.now());
  }
  function up(d) {
    const before = shown.get(d.instance);
    if (!before) {
      if (order.length && d.instance < order[order.length - 1]) unsorted = true;
      order.push(d.instance);
    } else if (before.status !== d.status) {
      note(`${name}/${d.instance}`, `${before.status} → ${d.status}${d.note ? ` (${d.note})` : ''}`, d.status);
    }
    shown.set(d.instance, d);
  }
  function row(i, at) {
    return h('a', { class: 'row', role: 'row', href: `#/instance/${enc(name)}/${enc(i.instance)}`, 'data-i': at, 'aria-rowindex': at + 1, onfocus: () => (focused = at) },
      h('span', { role: 'cell' }, i.instance),
      h('span', { role: 'cell' }, i.address),
      h('span', { role: 'cell', class: i.status }, i.status),
      h('span', { role: 'cell', title: metaText(i.meta) }, metaText(i.meta)),
      h('span', { role: 'cell' }, nodeName(i.node)));
  }
  /** Arrow keys, Page Up/Down, Home and End move between rows, scrolling as needed. */
  function keys(e) {
    const step = { ArrowDown: 1, ArrowUp: -1, PageDown: 10, PageUp: -10, Home: -Infinity, End: Infinity }[e.key];
    if (step === undefined || !list.length) return;
    e.preventDefault();
    focused = Math.max(0, Math.min(list.length - 1, (focused < 0 ? 0 : focused) + step));
    const rh = rowHeight();
    const top = focused * rh;
    if (top < scroll.scrollTop) scroll.scrollTop = top;
    else if (top + rh > scroll.scrollTop + scroll.clientHeight) scroll.scrollTop = top + rh - scroll.clientHeight;
    paint();
  }
  // The first render comes from one read (one JSON document parses far faster than as
  // many events); the stream then confirms each instance, and once it has been quiet for
  // QUIET_MS the ones it did not send (gone in between) are dropped. One it sends later
  // is shown again: the stream is the authority.
  let unconfirmed = null;
  let quiet = null;
  function confirmLater() {
    clearTimeout(quiet);
    quiet = setTimeout(() => {
      for (const id of unconfirmed ?? []) if (shown.delete(id)) removed = true;
      unconfirmed = null;
      changed();
    }, QUIET_MS);
  }
  let stop = null;
  let left = false;
  // Only the fields a row shows: half the bytes to send and parse.
  api(`/v1/services/${enc(name)}?all&fields=${ROW_FIELDS}`)
    .then((r) => {
      for (const d of r.body) up(d);
      changed();
    })
    .catch(() => {})
    .finally(() => {
      if (left) return;
      stop = follow(
        `/v1/services/${enc(name)}?watch&all`,
        (kind, data) => {
          const d = JSON.parse(data);
          unconfirmed?.delete(d.instance);
          if (kind !== 'down') up(d);
          else if (shown.delete(d.instance)) removed = true;
          if (unconfirmed) confirmLater();
          changed();
        },
        (resumed) => {
          if (resumed) return;
          unconfirmed = new Set(shown.keys());
          confirmLater();
        },
      );
    });
  return () => {
    left = true;
    clearTimeout(quiet);
    stop?.();
  };
}

// ---- One instance: what it is, where it came from, and the actions.

function showInstance(service, id) {
  const path = `/v1/services/${enc(service)}/instances/${enc(id)}`;
  const facts = h('dl', { class: 'kv' });
  const msg = h('p', { role: 'status', 'aria-live': 'polite' });
  const actions = h('div', { class: 'actions' });
  const provenance = h('div', {}, h('p', { class: 'muted' }, 'loading…'));
  view.replaceChildren(
    h('h1', {}, h('a', { href: '#/services' }, 'Services'), ' / ', h('a', { href: `#/service/${enc(service)}` }, service), ' / ', id),
    facts, actions, msg,
    h('h2', {}, 'Provenance (as roster explain gives it)'), provenance,
  );
  let last = '';
  let buttonsFor = null; // whether the buttons shown are for an instance in maintenance
  function show(i) {
    // The page's GET and the stream's first event bring the same (or only a renewed
    // lease): drawn once, and the buttons only when what they do changes, so a button is
    // not replaced under the pointer.
    const now = JSON.stringify(i);
    if (now === last) return;
    last = now;
    facts.replaceChildren(
      ...[['Instance', i.instance], ['Address', i.address], ['Status', h('span', { class: i.status, id: 'status' }, i.status)],
        ['Note', i.note || '—'], ['Node', `${nodeName(i.node)} (${i.node})`], ['Registered', when(i.registered_at)],
        ['Lease ends', when(i.lease_expires_at)], ['Metadata', metaText(i.meta) || '—']]
        .flatMap(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));
    const inMaint = i.status === 'maintenance';
    if (buttonsFor === inMaint) return;
    buttonsFor = inMaint;
    actions.replaceChildren(
      h('button', { type: 'button', id: 'maintenance', onclick: () => act(inMaint ? 'DELETE' : 'PUT', `${path}/maintenance`, inMaint ? `Take ${id} out of maintenance?` : `Put ${id} in maintenance (out of reads)?`) },
        inMaint ? 'Maintenance off' : 'Maintenance on'),
      h('button', { type: 'button', id: 'deregister', class: 'danger', onclick: () => act('DELETE', path, `Deregister ${id} of ${service}? It leaves every agent.`) }, 'Deregister'),
    );
  }
  function gone() {
    last = '';
    buttonsFor = null;
    facts.replaceChildren(h('p', { class: 'muted' }, `${id} is not live on this agent (deregistered, or its lease ended).`));
    actions.replaceChildren();
  }
  async function act(method, url, question) {
    if ((await ask(question, { ok: 'Yes' })) === null) return;
    try {
      await api(url, { method });
      msg.className = '';
      msg.textContent = 'Done.';
      explain();
    } catch (e) {
      msg.className = 'error';
      msg.textContent = e.message;
    }
  }
  async function explain() {
    try {
      const { body } = await api(`/v1/explain/${enc(service)}/${enc(id)}`);
      provenance.replaceChildren(h('dl', { class: 'kv' }, Object.entries(body).flatMap(([k, v]) => [
        h('dt', {}, k), h('dd', {}, typeof v === 'object' && v !== null ? h('pre', {}, JSON.stringify(v, null, 2)) : String(v))])));
    } catch (e) {
      provenance.replaceChildren(h('p', { class: 'error' }, e.message));
    }
  }
  explain();
  // The stream opens once the read is shown: it starts with the instance as it is then,
  // so nothing the read missed is lost, and no late answer to the read can draw an older
  // state over a change the stream already brought.
  let stop = null;
  let left = false;
  api(path)
    .then((r) => show(r.body), gone)
    .finally(() => {
      if (left) return;
      stop = follow(`/v1/services/${enc(service)}?watch&all`, (kind, data) => {
        const d = JSON.parse(data);
        if (d.instance !== id) return;
        if (kind === 'down') gone();
        else show(d);
      });
    });
  return () => {
    left = true;
    stop?.();
  };
}

// ---- Members and this agent.

function showMembers() {
  const box = h('div', {}, h('p', { class: 'muted' }, 'loading…'));
  view.replaceChildren(h('h1', {}, 'Members'), box);
  let stopped = false;
  (async () => {
    while (!stopped) {
      if (!document.hidden) await drawMembers(box);
      await sleep(MEMBERS_EVERY_MS);
    }
  })();
  return () => (stopped = true);
}

async function drawMembers(box) {
  try {
    const [{ body: members }, { body: me }] = await Promise.all([api('/v1/members'), api('/v1/status')]);
    for (const m of members) state.nodes.set(m.node, m.name);
    // Wide tables scroll inside their box, so the page itself never scrolls sideways.
    const table = (cols, rows) => h('div', { class: 'wide' }, h('table', {}, h('thead', {}, h('tr', {}, cols.map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, rows.map((r) => h('tr', {}, r.map((c) => h('td', {}, c)))))));
    const scalars = Object.entries(me).filter(([, v]) => typeof v !== 'object' || v === null);
    const counters = Object.entries(me.counters || {});
    box.replaceChildren(
      table(['Name', 'Node', 'Address', 'Zone', 'State', 'Last heard', 'Lease', 'Synced'], members.map((m) => [m.name, m.node, m.address,
        m.zone == null ? '—' : m.zone, h('span', { class: m.state === 'alive' ? 'passing' : 'critical' }, m.state), `${span(m.last_heard_ms)} ago`,
        m.lease_left_ms == null ? '—' : `in ${span(m.lease_left_ms)}`, m.synced_ms == null ? '—' : `${span(m.synced_ms)} ago`])),
      h('h2', {}, `This agent: ${me.name}`),
      h('dl', { class: 'kv' }, scalars.flatMap(([k, v]) => [h('dt', {}, k), h('dd', {}, String(v))])),
      h('h2', {}, 'Peers'),
      table(['Name', 'Address', 'Direction'], (me.peers || []).map((p) => [p.name, p.address, p.direction])),
      h('h2', {}, 'Counters'),
      h('dl', { class: 'kv' }, counters.flatMap(([k, v]) => [h('dt', {}, k), h('dd', {}, typeof v === 'object' ? JSON.stringify(v) : String(v))])),
    );
  } catch (e) {
    box.replaceChildren(h('p', { class: 'error' }, e.message));
  }
}

// ---- The last changes seen by this page on this agent.

function showChanges() {
  const list = h('ol', { class: 'changes', reversed: true });
  view.replaceChildren(
    h('h1', {}, 'Last status changes'),
    h('p', { class: 'muted' }, 'Seen on this agent since the page opened, newest first: count changes of every service, and each instance change of the service shown.'),
    list,
  );
  function draw() {
    list.replaceChildren(...state.changes.map((c) => h('li', {}, h('time', { datetime: c.at.toISOString() }, c.at.toLocaleTimeString()), ' ', h('strong', {}, c.what), ': ', h('span', { class: c.status || '' }, c.text))));
    if (!state.changes.length) list.replaceChildren(h('li', { class: 'muted' }, 'none yet'));
  }
  refresh.changes = draw;
  draw();
}

// ---- A dialog for questions and the token.

let asked = Promise.resolve();
/** Asks a question (with a text field when `input`); the text (or '') on OK, null on Cancel. */
function ask(text, { input = false, ok = 'OK' } = {}) {
  const next = asked.then(() => new Promise((done) => {
    const d = $('#ask');
    $('#ask-text').textContent = text;
    $('#ask-label').hidden = !input;
    $('#ask-input').hidden = !input;
    $('#ask-input').value = '';
    $('#ask-ok').textContent = ok;
    d.returnValue = '';
    d.addEventListener('close', () => done(d.returnValue === 'ok' ? $('#ask-input').value : null), { once: true });
    d.showModal();
    (input ? $('#ask-input') : $('#ask-ok')).focus();
  }));
  asked = next.catch(() => {});
  return next;
}

// ---- Routes: #/services, #/service/NAME, #/instance/SERVICE/ID, #/members, #/changes.

let leave = null;
function route() {
  leave?.();
  leave = null;
  refresh.summary = refresh.changes = null;
  const [, kind = 'services', a, b] = location.hash.slice(1).split('/').map(decodeURIComponent);
  const tab = { service: 'services', instance: 'services' }[kind] ?? kind;
  for (const l of document.querySelectorAll('nav a')) {
    l.toggleAttribute('aria-current', l.getAttribute('href') === `#/${tab}`);
    if (l.hasAttribute('aria-current')) l.setAttribute('aria-current', 'page');
  }
  if (kind === 'service' && a) leave = showService(a);
  else if (kind === 'instance' && a && b) leave = showInstance(a, b);
  else if (kind === 'members') leave = showMembers();
  else if (kind === 'changes') showChanges();
  else showServices();
  view.focus();
}

async function start() {
  window.addEventListener('hashchange', route);
  route();
  followSummary();
  loadNodes();
  try {
    const { body } = await api('/v1/status');
    $('#agent').textContent = `agent ${body.name}`;
    document.title = `roster: ${body.name}`;
  } catch {
    // The connection badge says it.
  }
}

start();
