// The portal shell: sign-in, navigation by role, and hash routing (#/overview, #/devices, ...).
import * as api from './api.js';
import { h, field, errorBox, announce } from './ui.js';
import * as overview from './overview.js';
import * as devices from './devices.js';
import * as users from './users.js';
import * as bundles from './bundles.js';
import * as observations from './observations.js';
import * as exports from './exports.js';
import * as audit from './audit.js';
import * as scopes from './scopes.js';

const ROUTES = [
  { path: 'overview', title: 'Overview', render: overview.render },
  { path: 'devices', title: 'Devices', render: devices.render, admin: true },
  { path: 'users', title: 'Users', render: users.render, admin: true },
  { path: 'scopes', title: 'Scopes', render: scopes.render, detail: scopes.renderFor, admin: true },
  { path: 'bundles', title: 'App bundles', render: bundles.render, detail: bundles.renderFiles },
  { path: 'observations', title: 'Observations', render: observations.render, detail: observations.renderOne },
  { path: 'exports', title: 'Exports', render: exports.render },
  { path: 'audit', title: 'Audit', render: audit.render, admin: true },
  { path: 'account', title: 'My account', render: users.renderAccount, hidden: true },
];

// Fragment links resolve against <base>: make the document URL the base URL itself, so that
// `#/users` stays in this document whether it was opened as /portal, /portal/ or index.html.
const base = new URL(document.baseURI);
if (location.pathname + '/' === base.pathname || location.pathname === `${base.pathname}index.html`) {
  history.replaceState(null, '', base.pathname + location.search + location.hash);
}

const main = document.getElementById('main');
const nav = document.getElementById('nav');
const who = document.getElementById('who');
const notices = document.getElementById('notices');
// What the page on screen started (timers, pollers) and has to stop when it goes.
let cleanup = null;
// Raised by every navigation and sign-out. A render that was still awaiting its data when the
// number moved on belongs to a page that is gone: its late result must not paint, focus or
// announce anything, and whatever it started is stopped at once.
let navigation = 0;
let signedOutReason = '';

function leavePage() {
  navigation += 1;
  if (cleanup) {
    cleanup();
    cleanup = null;
  }
}

function parseHash() {
  const [path, ...rest] = location.hash.replace(/^#\/?/, '').split('/');
  return { path: path || 'overview', param: rest.length ? decodeURIComponent(rest.join('/')) : null };
}

function drawNav(current) {
  const user = api.currentUser();
  nav.replaceChildren(
    h('ul', {}, ROUTES.filter((r) => !r.hidden && (!r.admin || api.isAdmin())).map((r) =>
      h('li', {}, h('a', { href: `#/${r.path}`, 'aria-current': r.path === current ? 'page' : null }, r.title)))),
  );
  who.replaceChildren(
    h('a', { href: '#/account', class: 'who', 'aria-current': current === 'account' ? 'page' : null },
      h('span', { class: 'name' }, user.username), ' ', h('span', { class: `role role-${user.role}` }, user.role)),
    h('button', { type: 'button', class: 'secondary small', id: 'sign-out', onclick: () => api.logout() }, 'Sign out'),
  );
}

async function route() {
  // Skip links and other in-page anchors are not routes: the page stays as it is.
  if (api.currentUser() && location.hash && !location.hash.startsWith('#/')) return;
  leavePage();
  const mine = navigation;
  if (!api.currentUser()) {
    signIn();
    return;
  }
  const { path, param } = parseHash();
  const r = ROUTES.find((x) => x.path === path) || ROUTES[0];
  const allowed = !r.admin || api.isAdmin();
  drawNav(r.path);
  document.body.classList.remove('signed-out');
  document.title = `${r.title} · Synkronus`;
  const heading = h('h1', { tabindex: '-1' }, r.title);
  // Each visit renders into a container of its own: once the next navigation replaces it, a
  // render that resolves late writes into a detached node, never into the new page.
  const page = h('div', { class: 'page', 'data-page': r.path }, heading);
  main.replaceChildren(page);
  main.setAttribute('aria-busy', 'true');
  let dispose = null;
  let failure = null;
  try {
    if (!allowed) {
      page.append(errorBox({ code: 'FORBIDDEN', message: 'This page is for admins.' }));
    } else if (param !== null && r.detail) {
      dispose = (await r.detail(page, param)) || null;
    } else {
      dispose = (await r.render(page)) || null;
    }
  } catch (err) {
    failure = err;
  }
  if (mine !== navigation) {
    if (dispose) dispose();
    return;
  }
  cleanup = dispose;
  if (failure) page.append(errorBox(failure));
  main.removeAttribute('aria-busy');
  heading.focus({ preventScroll: true });
  announce(`${r.title} loaded`);
}

/**
 * Asks the signed-in user, above every page, to replace the shipped password while the server
 * says they still have it (GET /auth/me, docs/api.md §6.5). Checked once per sign-in; changing
 * the password ends the session, and the next sign-in checks again.
 */
async function checkDefaultPassword() {
  notices.replaceChildren();
  const user = api.currentUser();
  if (!user) return;
  // Busy until the answer is in: assistive technology (and the browser tests) wait for it.
  notices.setAttribute('aria-busy', 'true');
  let me;
  try {
    me = (await api.get('auth/me')).data;
  } catch {
    return; // Advice only: a failed check shows nothing, and the page shows its own errors.
  } finally {
    notices.removeAttribute('aria-busy');
  }
  // Signed out, or signed in as somebody else, while the answer was on its way.
  if (api.currentUser()?.id !== me.id || !me.default_password) return;
  notices.replaceChildren(
    h('div', { class: 'banner', role: 'alert', id: 'default-password' },
      h('p', {},
        h('strong', {}, `The ${me.username} account still has the default password.`),
        ' Anyone who knows it can sign in as this admin: ',
        h('a', { href: '#/account' }, 'choose a new password in My account'),
        '.')),
  );
}

function signIn() {
  document.body.classList.add('signed-out');
  nav.replaceChildren();
  who.replaceChildren();
  document.title = 'Sign in · Synkronus';
  main.removeAttribute('aria-busy');
  notices.replaceChildren();
  const username = h('input', { id: 'username', name: 'username', autocomplete: 'username', required: true });
  const password = h('input', { id: 'password', name: 'password', type: 'password', autocomplete: 'current-password', required: true });
  const slot = h('div', { 'aria-live': 'assertive' });
  const submit = h('button', { class: 'primary', id: 'sign-in' }, 'Sign in');
  const form = h(
    'form',
    {
      class: 'signin card',
      onsubmit: async (e) => {
        e.preventDefault();
        submit.disabled = true;
        slot.replaceChildren();
        try {
          await api.login(username.value, password.value);
        } catch (err) {
          slot.replaceChildren(errorBox(err));
          password.select();
        } finally {
          submit.disabled = false;
        }
      },
    },
    h('h1', {}, 'Sign in'),
    signedOutReason ? h('p', { class: 'notice', role: 'status' }, signedOutReason) : null,
    field('User name', username).wrap,
    field('Password', password).wrap,
    submit,
    slot,
  );
  main.replaceChildren(form);
  username.focus();
}

api.onSessionChange((session, reason) => {
  if (session) {
    // A refresh keeps the page; a new sign-in lands on the page asked for.
    if (!document.body.classList.contains('signed-out')) return;
    signedOutReason = '';
    route();
    checkDefaultPassword();
  } else {
    signedOutReason = reason || '';
    leavePage();
    signIn();
  }
});

document.getElementById('skip').addEventListener('click', (e) => {
  e.preventDefault();
  (main.querySelector('h1') || main).focus();
});
window.addEventListener('hashchange', route);
route();
checkDefaultPassword();
