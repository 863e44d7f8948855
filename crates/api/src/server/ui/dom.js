// Building the page from data with DOM calls only: every value goes in as a text node or an
// attribute value, never as markup, so a name like `<img onerror=…>` shows as those characters.

/** An element: `props` sets `class`, `text`, `dataset` (data-* attributes), `on` (listeners)
 *  and plain attributes; `children` are nodes, strings (as text) or arrays of them. */
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'class') node.className = value;
    else if (key === 'text') node.textContent = String(value);
    else if (key === 'dataset') {
      for (const [k, v] of Object.entries(value)) {
        if (v !== undefined && v !== null) node.dataset[k] = String(v);
      }
    } else if (key === 'on') {
      for (const [event, fn] of Object.entries(value)) node.addEventListener(event, fn);
    } else node.setAttribute(key, value === true ? '' : String(value));
  }
  append(node, children);
  return node;
}

/** Appends `children` (nodes, strings as text, nested arrays; null and false skipped). */
export function append(node, children) {
  for (const child of [children].flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** A link to a view of the page (`#/job/<id>`): ids are percent-encoded into the hash. */
export function link(parts, text, props = {}) {
  const hash = '#/' + parts.map((p) => encodeURIComponent(p)).join('/');
  return el('a', { ...props, href: hash }, text);
}

/** A table: `head` are column titles, `rows` are `<tr>` elements. */
export function table(id, head, rows, empty = 'none') {
  const body = el('tbody', {}, rows);
  if (rows.length === 0) {
    body.append(el('tr', { class: 'empty' }, el('td', { colspan: head.length }, empty)));
  }
  return el('table', { id }, el('thead', {}, el('tr', {}, head.map((h) => el('th', {}, h)))), body);
}

/** A row of cells (each a node, a string or an array). */
export function row(props, cells) {
  return el('tr', props, cells.map((c) => el('td', {}, c)));
}

/** A `label: value` list (`<dl>`). */
export function facts(id, pairs) {
  return el(
    'dl',
    { id, class: 'facts' },
    pairs.filter(([, v]) => v !== undefined && v !== null && v !== '').map(([k, v]) => [el('dt', {}, k), el('dd', {}, v)]),
  );
}

/** A small colored word for a state (`running`, `healthy`…). */
export function badge(word, kind = word) {
  return el('span', { class: 'badge ' + badgeClass(kind), dataset: { badge: word } }, word);
}

function badgeClass(kind) {
  switch (kind) {
    case 'running':
    case 'healthy':
    case 'ready':
    case 'claimed':
    case 'published':
    case 'staged':
    case 'live':
      return 'ok';
    case 'failed':
    case 'unhealthy':
    case 'down':
    case 'lost':
      return 'bad';
    case 'pending':
    case 'starting':
    case 'claiming':
    case 'releasing':
    case 'draining':
    case 'stop':
      return 'warn';
    default:
      return 'plain';
  }
}

/** Milliseconds since the epoch as local date and time; `—` for 0 or nothing. */
export function when(ms) {
  if (!ms) return '—';
  const d = new Date(ms);
  return Number.isNaN(d.getTime()) ? '—' : d.toLocaleString();
}

/** A serde `SystemTime` (`{secs_since_epoch, nanos_since_epoch}`) in milliseconds. */
export function systemTimeMs(t) {
  if (!t || typeof t.secs_since_epoch !== 'number') return 0;
  return t.secs_since_epoch * 1000 + Math.floor((t.nanos_since_epoch || 0) / 1e6);
}

/** Bytes as `1.5 GiB`; `—` for 0 (unknown). */
export function bytes(n) {
  if (!n || n <= 0) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return (i === 0 ? String(v) : v.toFixed(v < 10 ? 1 : 0)) + ' ' + units[i];
}

/** `key=value` pairs of an object, for attributes and meta. */
export function pairs(obj) {
  return Object.entries(obj || {}).map(([k, v]) => `${k}=${v}`);
}
