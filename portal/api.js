// The portal's only way to the server: the public API (docs/api.md), with the signed-in user's own
// token. Tokens live in sessionStorage (gone when the tab closes); an expired access token is
// renewed once through POST /auth/refresh, exactly as a client would.

const API_ROOT = new URL('..', document.baseURI);
const KEY = 'synkronus.portal.session';
// Every authenticated request counts as presence (docs/api.md §17.4): name the portal, so that it is
// listed as "portal" among the devices rather than as an unnamed client.
const CLIENT_ID = 'portal';

export class ApiError extends Error {
  constructor(status, body) {
    super(body.message || body.detail || `HTTP ${status}`);
    this.status = status;
    this.code = body.code || body.error || '';
    this.errors = Array.isArray(body.errors) ? body.errors : [];
  }
}

let session = load();
const listeners = new Set();

function load() {
  try {
    const raw = sessionStorage.getItem(KEY);
    return raw ? JSON.parse(raw) : null;
  } catch {
    return null;
  }
}

function store(next, reason) {
  session = next;
  if (next) sessionStorage.setItem(KEY, JSON.stringify(next));
  else sessionStorage.removeItem(KEY);
  for (const fn of listeners) fn(session, reason);
}

function fromLogin(body) {
  return {
    token: body.token,
    refreshToken: body.refresh_token || body.refreshToken,
    expiresAt: body.expiresAt,
    ttl: body.expires_in,
    user: body.user,
  };
}

export const onSessionChange = (fn) => listeners.add(fn);
export const currentUser = () => (session ? session.user : null);
export const isAdmin = () => session?.user?.role === 'admin';

/** An absolute URL for an API path ("users", "app-bundle/download/x"), with query parameters. */
export function apiUrl(path, query) {
  const url = new URL(path.replace(/^\/+/, ''), API_ROOT);
  for (const [key, value] of Object.entries(query || {})) {
    if (value === undefined || value === null || value === '') continue;
    for (const v of Array.isArray(value) ? value : [value]) url.searchParams.append(key, String(v));
  }
  return url;
}

async function errorBody(res) {
  try {
    return await res.json();
  } catch {
    return { message: `${res.status} ${res.statusText}` };
  }
}

let refreshing = null;

/** Renews the token pair; a failure ends the session (the refresh token is single-use). */
export function refresh() {
  if (!refreshing) {
    refreshing = (async () => {
      const current = session;
      if (!current) throw new ApiError(401, { code: 'MISSING_TOKEN', message: 'Not signed in' });
      const res = await fetch(apiUrl('auth/refresh'), {
        method: 'POST',
        headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ refresh_token: current.refreshToken }),
      });
      if (!res.ok) {
        const err = new ApiError(res.status, await errorBody(res));
        store(null, 'Your session has ended; please sign in again.');
        throw err;
      }
      store(fromLogin(await res.json()));
    })().finally(() => {
      refreshing = null;
    });
  }
  return refreshing;
}

/** Refreshes ahead of time when the access token has under 30 s (or a quarter of its life) left. */
async function freshToken() {
  const margin = Math.min(30_000, (session?.ttl || 3600) * 250);
  if (session && session.expiresAt && session.expiresAt * 1000 - Date.now() < margin) await refresh();
  return session ? session.token : null;
}

async function send(method, path, { query, json, headers, body } = {}, retried = false) {
  const h = new Headers(headers || {});
  const token = await freshToken();
  if (token) h.set('Authorization', `Bearer ${token}`);
  h.set('x-ode-client-id', CLIENT_ID);
  let payload = body;
  if (json !== undefined) {
    h.set('Content-Type', 'application/json');
    payload = JSON.stringify(json);
  }
  const res = await fetch(apiUrl(path, query), { method, headers: h, body: payload, cache: 'no-store' });
  if (res.ok) return res;
  const err = new ApiError(res.status, await errorBody(res));
  if (res.status === 401 && session) {
    if (err.code === 'TOKEN_EXPIRED' && !retried) {
      await refresh();
      return send(method, path, { query, json, headers, body }, true);
    }
    // A revoked or stale token (password reset, role change, deletion): sign in again.
    store(null, `Your session has ended: ${err.message}`);
  }
  throw err;
}

/** A JSON (or text) answer; errors throw ApiError with the server's message and items. */
export async function request(method, path, opts) {
  const res = await send(method, path, opts);
  const type = res.headers.get('content-type') || '';
  if (method === 'HEAD') return res;
  return type.includes('json') ? res.json() : res.text();
}

export const get = (path, query) => request('GET', path, { query });
export const post = (path, json, query) => request('POST', path, { json, query });
export const put = (path, json) => request('PUT', path, { json });
export const del = (path) => request('DELETE', path);
export const head = (path, query) => send('HEAD', path, { query });

function filenameOf(res, fallback) {
  const cd = res.headers.get('content-disposition') || '';
  const star = /filename\*=UTF-8''([^;]+)/i.exec(cd);
  if (star) return decodeURIComponent(star[1]);
  const plain = /filename="?([^";]+)"?/i.exec(cd);
  return plain ? plain[1] : fallback;
}

/**
 * Fetches a file with the bearer token into a Blob, reporting (bytes, total|null) as it streams.
 * Returns {blob, filename, headers}.
 */
export async function download(path, query, onProgress, fallbackName = 'download') {
  const res = await send('GET', path, { query });
  const total = Number(res.headers.get('content-length')) || null;
  const type = res.headers.get('content-type') || 'application/octet-stream';
  const chunks = [];
  let done = 0;
  if (res.body && res.body.getReader) {
    const reader = res.body.getReader();
    for (;;) {
      const { value, done: end } = await reader.read();
      if (end) break;
      chunks.push(value);
      done += value.length;
      if (onProgress) onProgress(done, total);
    }
  } else {
    chunks.push(new Uint8Array(await res.arrayBuffer()));
  }
  return { blob: new Blob(chunks, { type }), filename: filenameOf(res, fallbackName), headers: res.headers };
}

/** A multipart upload through XMLHttpRequest, for its upload progress events. */
export async function upload(path, form, onProgress, query, retried = false) {
  const token = await freshToken();
  const result = await new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open('POST', apiUrl(path, query));
    if (token) xhr.setRequestHeader('Authorization', `Bearer ${token}`);
    xhr.setRequestHeader('x-ode-client-id', CLIENT_ID);
    xhr.responseType = 'text';
    xhr.upload.addEventListener('progress', (e) => {
      if (onProgress) onProgress(e.loaded, e.lengthComputable ? e.total : null);
    });
    xhr.addEventListener('load', () => {
      let body;
      try {
        body = JSON.parse(xhr.responseText || '{}');
      } catch {
        body = { message: `${xhr.status} ${xhr.statusText}` };
      }
      resolve({ status: xhr.status, body });
    });
    xhr.addEventListener('error', () => reject(new ApiError(0, { message: 'The upload failed: network error' })));
    xhr.addEventListener('abort', () => reject(new ApiError(0, { message: 'The upload was cancelled' })));
    xhr.send(form);
  });
  if (result.status >= 200 && result.status < 300) return result.body;
  const err = new ApiError(result.status, result.body);
  if (result.status === 401 && session) {
    if (err.code === 'TOKEN_EXPIRED' && !retried) {
      await refresh();
      return upload(path, form, onProgress, query, true);
    }
    store(null, `Your session has ended: ${err.message}`);
  }
  throw err;
}

export async function login(username, password) {
  const res = await fetch(apiUrl('auth/login'), {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ username, password }),
  });
  if (!res.ok) throw new ApiError(res.status, await errorBody(res));
  store(fromLogin(await res.json()));
}

/** Revokes the access token and the refresh token on the server, then forgets both. */
export async function logout() {
  const current = session;
  if (!current) return;
  try {
    await fetch(apiUrl('auth/logout'), {
      method: 'POST',
      headers: {
        'Content-Type': 'application/json', Authorization: `Bearer ${current.token}`, 'x-ode-client-id': CLIENT_ID,
      },
      body: JSON.stringify({ refresh_token: current.refreshToken }),
    });
  } finally {
    store(null, 'You have signed out.');
  }
}

/** Ends the session locally after the server has revoked it (a password change). */
export const forget = (reason) => store(null, reason);
