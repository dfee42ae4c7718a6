// Audit log (admin, docs/api.md §18.4): who did what, from where, newest first; filters by user,
// action and time window, paged with the API's page tokens.
import * as api from './api.js';
import { h, section, table, timeEl, field, showError, button, badge } from './ui.js';

// The actions the server records (src/domain/audit.rs), as the filter offers them.
const ACTIONS = [
  ['auth.sign_in', 'Sign-in'],
  ['auth.sign_in_failed', 'Sign-in failed'],
  ['auth.refresh_token_reused', 'Refresh token reused'],
  ['user.create', 'User created'],
  ['user.delete', 'User deleted'],
  ['user.role_change', 'Role changed'],
  ['user.password_reset', 'Password reset'],
  ['user.password_change', 'Password changed'],
  ['user.attributes_change', 'Attributes changed'],
  ['bundle.push', 'Bundle pushed'],
  ['bundle.activate', 'Bundle activated'],
  ['bundle.rollback', 'Bundle rolled back'],
  ['bundle.retention_delete', 'Bundle version removed by retention'],
  ['repository.reset', 'Repository reset'],
  ['formspec.change', 'Form spec changed'],
  ['export.start', 'Export started'],
  ['export.download', 'Export downloaded'],
  ['scope.change', 'Scope set changed'],
  ['scope.activate', 'Scope set in force'],
  ['server.start', 'Server started'],
];
const WARN = new Set(['auth.sign_in_failed', 'auth.refresh_token_reused', 'repository.reset', 'user.delete']);

/** A datetime-local value as RFC 3339 in UTC (the browser's time zone applied), or ''. */
const toRfc3339 = (v) => (v ? new Date(v).toISOString() : '');

const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);
const isStrings = (v) => Array.isArray(v) && v.every((x) => typeof x === 'string');

/** Details as `key: value` pairs on one line; user attributes read as `name: a, b`, a list of
 * scope rules and a nested object (the configuration of a server start) are summarised, and the
 * whole of it is the cell's tooltip. */
function details(d) {
  const entries = Object.entries(d || {});
  if (!entries.length) return '—';
  const text = entries.map(([k, v]) => {
    if (isObject(v) && Object.values(v).every(isStrings)) {
      const pairs = Object.entries(v).map(([name, values]) => `${name}: ${values.join(', ')}`);
      return `${k}: {${pairs.join('; ')}}`;
    }
    if (isObject(v)) return `${k}: {${Object.keys(v).length} settings}`;
    if (Array.isArray(v) && v.some(isObject)) return `${k}: [${v.length} ${k === 'rules' && v.length === 1 ? 'rule' : k}]`;
    return `${k}: ${typeof v === 'string' ? v : JSON.stringify(v)}`;
  });
  return h('span', { class: 'details', title: JSON.stringify(d, null, 1) }, text.join(', '));
}

export async function render(main) {
  const actor = h('input', { id: 'audit-actor', type: 'search', autocomplete: 'off' });
  const action = h(
    'select',
    { id: 'audit-action' },
    h('option', { value: '' }, 'Every action'),
    ACTIONS.map(([value, label]) => h('option', { value }, label)),
  );
  const since = h('input', { id: 'audit-since', type: 'datetime-local' });
  const until = h('input', { id: 'audit-until', type: 'datetime-local' });
  const submit = h('button', { class: 'primary' }, 'Search');
  const slot = h('div');
  const results = h('div');
  const more = button('Older entries', () => load(false), 'secondary', { id: 'audit-more' });
  more.hidden = true;
  const form = h(
    'form',
    { class: 'filters', onsubmit: (e) => { e.preventDefault(); load(true); } },
    field('User name', actor).wrap,
    field('Action', action).wrap,
    field('From', since).wrap,
    field('Until', until).wrap,
    submit,
  );
  main.append(section('Audit log', form, slot, results, more));

  let rows = [];
  let token = null;
  // Raised by every new search and when the page goes: a page of results that arrives after
  // that belongs to a search nobody is waiting for any more, and must not paint.
  let generation = 0;

  async function load(fresh) {
    const mine = ++generation;
    const btn = fresh ? submit : more;
    btn.disabled = true;
    btn.setAttribute('aria-busy', 'true');
    try {
      const query = fresh
        ? {
          actor: actor.value.trim(),
          action: action.value,
          since: toRfc3339(since.value),
          until: toRfc3339(until.value),
          limit: 50,
        }
        : { page_token: token, limit: 50 };
      const page = await api.get('admin/audit', query);
      if (mine !== generation) return;
      showError(slot, null);
      rows = fresh ? page.items : rows.concat(page.items);
      token = page.next_page_token;
      more.hidden = !token;
      draw();
    } catch (err) {
      if (mine === generation) showError(slot, err);
    } finally {
      btn.disabled = false;
      btn.removeAttribute('aria-busy');
    }
  }

  function draw() {
    results.replaceChildren(
      h('p', { 'aria-live': 'polite' }, `${rows.length} entries${token ? ' so far' : ''}.`),
      table(
        'Audit log entries, newest first',
        [
          { label: 'When', cell: (e) => timeEl(e.at) },
          { label: 'Who', cell: (e) => e.actor || h('em', {}, 'server') },
          {
            label: 'Action',
            cell: (e) => (WARN.has(e.action) ? badge(e.action, 'warn') : h('code', {}, e.action)),
          },
          { label: 'Target', cell: (e) => e.target || '—' },
          { label: 'Client IP', cell: (e) => e.client_ip || '—' },
          { label: 'Details', cell: (e) => details(e.details) },
          { label: 'Request', cell: (e) => (e.request_id ? h('code', {}, e.request_id) : '—') },
          { label: 'Node', cell: (e) => e.node },
        ],
        rows,
        { empty: 'No audit entry matches.' },
      ),
    );
  }

  await load(true);
  return () => {
    generation += 1;
  };
}
