// DOM helpers. Every server value reaches the page as text (textContent / attributes), never as
// HTML, so record data cannot inject markup.

/** h('div', {class: 'x', onclick: fn, 'aria-label': 'y'}, child, 'text', [more]) */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on') && typeof value === 'function') el.addEventListener(key.slice(2), value);
    else if (key === 'class') el.className = value;
    else if (key === 'text') el.textContent = value;
    else if (key in el && typeof value !== 'string') el[key] = value;
    else el.setAttribute(key, value === true ? '' : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

let idCounter = 0;
export const uid = (prefix = 'f') => `${prefix}-${++idCounter}`;

/** A labelled form field: returns {wrap, input}. */
export function field(label, input, hint) {
  const id = input.id || uid();
  input.id = id;
  const hintEl = hint ? h('small', { class: 'hint', id: `${id}-hint` }, hint) : null;
  if (hintEl) input.setAttribute('aria-describedby', hintEl.id);
  return { wrap: h('div', { class: 'field' }, h('label', { for: id }, label), input, hintEl), input };
}

export function fmtTime(iso) {
  if (!iso) return '—';
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? String(iso) : d.toLocaleString();
}

export function ago(iso) {
  if (!iso) return 'never';
  const s = Math.round((Date.now() - new Date(iso).getTime()) / 1000);
  if (s < 60) return `${Math.max(s, 0)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}

/** A <time> element showing a relative age, the exact time as its tooltip. */
export const timeEl = (iso, relative = false) =>
  iso ? h('time', { datetime: iso, title: fmtTime(iso) }, relative ? ago(iso) : fmtTime(iso)) : '—';

export function fmtBytes(n) {
  if (n === null || n === undefined) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB'];
  let v = Number(n);
  let u = 0;
  while (v >= 1024 && u < units.length - 1) {
    v /= 1024;
    u += 1;
  }
  return `${u ? v.toFixed(1) : v} ${units[u]}`;
}

export const fmtNum = (n) => (n === null || n === undefined ? '—' : Number(n).toLocaleString());

/** The server's error as shown to the user: its message, then each item problem. */
export function errorBox(err) {
  const items = (err.errors || []).map((e) =>
    h('li', {}, e.path ? h('code', {}, e.path) : null, e.path ? ': ' : '', e.message || '', e.code ? ` (${e.code})` : ''),
  );
  return h(
    'div',
    { class: 'error', role: 'alert' },
    h('p', {}, h('strong', {}, 'Error'), err.code ? ` (${err.code})` : '', ': ', err.message || String(err)),
    items.length ? h('ul', { class: 'problems' }, items) : null,
  );
}

/** Replaces the contents of a message slot with an error (or clears it with null). */
export function showError(slot, err) {
  slot.replaceChildren(err ? errorBox(err) : '');
}

export function success(slot, text) {
  slot.replaceChildren(h('p', { class: 'ok', role: 'status' }, text));
}

/** Announces to screen readers through the page's polite live region. */
export function announce(text) {
  const region = document.getElementById('announcer');
  if (region) {
    region.textContent = '';
    setTimeout(() => {
      region.textContent = text;
    }, 30);
  }
}

/**
 * A table: columns = [{label, cell: (row) => node|string, class?}], with a caption.
 * rowClass(row) may add a class to a row.
 */
export function table(caption, columns, rows, { rowClass, empty = 'Nothing to show.' } = {}) {
  if (!rows.length) return h('p', { class: 'empty' }, empty);
  return h(
    'div',
    { class: 'table-wrap', tabindex: '0', role: 'region', 'aria-label': caption },
    h(
      'table',
      {},
      h('caption', {}, caption),
      h('thead', {}, h('tr', {}, columns.map((c) => h('th', { scope: 'col', class: c.class }, c.label)))),
      h(
        'tbody',
        {},
        rows.map((row) =>
          h(
            'tr',
            { class: rowClass ? rowClass(row) : null },
            columns.map((c) => h('td', { class: c.class, 'data-label': c.label }, c.cell(row))),
          ),
        ),
      ),
    ),
  );
}

/** A labelled progress bar: set(fraction or null for indeterminate, text). */
export function progress(label) {
  const bar = h('progress', { max: '1', 'aria-label': label });
  const text = h('span', { class: 'progress-text', 'aria-live': 'polite' });
  const el = h('div', { class: 'progress', hidden: true }, bar, text);
  return {
    el,
    set(fraction, message) {
      el.hidden = false;
      if (fraction === null || fraction === undefined) bar.removeAttribute('value');
      else bar.value = Math.min(Math.max(fraction, 0), 1);
      text.textContent = message || '';
    },
    hide() {
      el.hidden = true;
    },
  };
}

/** A modal confirmation (native <dialog>: focus trapped, Escape cancels). */
export function confirmDialog(title, message, confirmLabel = 'Confirm', danger = false) {
  return new Promise((resolve) => {
    const dialog = h(
      'dialog',
      { class: 'dialog', 'aria-labelledby': 'dialog-title' },
      h(
        'form',
        { method: 'dialog' },
        h('h2', { id: 'dialog-title' }, title),
        h('p', {}, message),
        h(
          'div',
          { class: 'actions' },
          h('button', { value: 'cancel', class: 'secondary' }, 'Cancel'),
          h('button', { value: 'ok', class: danger ? 'danger' : 'primary' }, confirmLabel),
        ),
      ),
    );
    dialog.addEventListener('close', () => {
      resolve(dialog.returnValue === 'ok');
      dialog.remove();
    });
    document.body.append(dialog);
    dialog.showModal();
  });
}

/** A modal with one password field; resolves to the value or null. */
export function passwordDialog(title, label) {
  return new Promise((resolve) => {
    const input = h('input', { type: 'password', autocomplete: 'new-password', minlength: '8', required: true });
    const f = field(label, input, 'At least 8 characters.');
    const dialog = h(
      'dialog',
      { class: 'dialog', 'aria-labelledby': 'dialog-title' },
      h(
        'form',
        { method: 'dialog' },
        h('h2', { id: 'dialog-title' }, title),
        f.wrap,
        h(
          'div',
          { class: 'actions' },
          h('button', { value: 'cancel', class: 'secondary', formnovalidate: true }, 'Cancel'),
          h('button', { value: 'ok', class: 'primary' }, 'Save'),
        ),
      ),
    );
    dialog.addEventListener('close', () => {
      resolve(dialog.returnValue === 'ok' ? input.value : null);
      dialog.remove();
    });
    document.body.append(dialog);
    dialog.showModal();
  });
}

/** Hands a Blob to the browser as a file download. */
export function saveBlob(blob, filename) {
  const url = URL.createObjectURL(blob);
  const a = h('a', { href: url, download: filename, hidden: true });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

export const section = (title, ...children) =>
  h('section', { class: 'card', 'aria-label': title }, h('h2', {}, title), ...children);

export const badge = (text, kind = '') => h('span', { class: `badge ${kind}` }, text);

export const button = (label, onclick, cls = 'secondary', attrs = {}) =>
  h('button', { type: 'button', class: cls, onclick, ...attrs }, label);

/** Runs an async action with its button disabled, showing any error in slot. */
export async function busy(btn, slot, fn) {
  btn.disabled = true;
  btn.setAttribute('aria-busy', 'true');
  if (slot) showError(slot, null);
  try {
    return await fn();
  } catch (err) {
    if (slot) showError(slot, err);
    else throw err;
    return undefined;
  } finally {
    btn.disabled = false;
    btn.removeAttribute('aria-busy');
  }
}
