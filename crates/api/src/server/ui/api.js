// Every call the page makes to the agent's API goes through `apiFetch`, which adds the ACL
// token header when the user set a token, and reports 401/403 answers to the page.

/** The header that carries the ACL token. */
export const TOKEN_HEADER = 'X-Berth-Token';

const TOKEN_KEY = 'berth.token';

/** The token the user set, or ''. */
export function getToken() {
  try {
    return localStorage.getItem(TOKEN_KEY) || '';
  } catch {
    return '';
  }
}

/** Keeps `token` for later visits (an empty one removes it). */
export function setToken(token) {
  try {
    if (token) localStorage.setItem(TOKEN_KEY, token);
    else localStorage.removeItem(TOKEN_KEY);
  } catch {
    // Storage may be off (private mode): the token then lasts until the page is left.
  }
  memoryToken = token;
}

let memoryToken = getToken();

function currentToken() {
  return getToken() || memoryToken || '';
}

/** What went wrong with an API call: the HTTP status (0: no answer) and the agent's words. */
export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }

  /** The agent wants a token, or refused the one sent. */
  get isAuth() {
    return this.status === 401 || this.status === 403;
  }
}

/** The names of the headers of the latest requests, for tests (no values: the token stays
 *  out of page globals). */
export const sentRequests = [];
const MAX_RECORDED = 100;

let authListener = () => {};

/** `fn(status, hadToken)` is called on each 401/403, `fn(0)` on each other answer. */
export function onAuth(fn) {
  authListener = fn;
}

/** `fetch(path)` with the token header (when set) and no caching. Answers 401/403 are reported
 *  to the `onAuth` listener and returned like any other. */
export async function apiFetch(path, init = {}) {
  const headers = new Headers(init.headers || {});
  const token = currentToken();
  if (token) headers.set(TOKEN_HEADER, token);
  sentRequests.push({ path, headers: [...headers.keys()] });
  if (sentRequests.length > MAX_RECORDED) sentRequests.splice(0, sentRequests.length - MAX_RECORDED);
  let resp;
  try {
    resp = await fetch(path, { ...init, headers, cache: 'no-store', credentials: 'same-origin' });
  } catch (e) {
    if (e && e.name === 'AbortError') throw e;
    throw new ApiError(0, 'the agent does not answer');
  }
  if (resp.status === 401 || resp.status === 403) authListener(resp.status, token !== '');
  else authListener(0, token !== '');
  return resp;
}

/** The JSON document at `path`; an ApiError with the agent's message otherwise. */
export async function getJSON(path, signal) {
  const resp = await apiFetch(path, { signal, headers: { Accept: 'application/json' } });
  if (!resp.ok) throw await errorOf(resp);
  return resp.json();
}

/** The ApiError of a failed answer, with the agent's `{"error": …}` text when there is one. */
export async function errorOf(resp) {
  let message = `HTTP ${resp.status}`;
  try {
    const body = await resp.json();
    if (body && typeof body.error === 'string') message = body.error;
  } catch {
    // Not JSON: the status says enough.
  }
  return new ApiError(resp.status, message);
}

/** `/v1/<parts…>` with each part percent-encoded. */
export function apiPath(...parts) {
  return '/v1/' + parts.map((p) => encodeURIComponent(p)).join('/');
}
