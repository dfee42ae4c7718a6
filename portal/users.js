// Users (admin): list, create, change role, reset password, delete (docs/api.md §7). And the signed-in
// user's own account page (change password), open to every role.
import * as api from './api.js';
import {
  h, section, table, timeEl, field, showError, success, button, busy, confirmDialog, passwordDialog, announce,
} from './ui.js';

const ROLES = ['read-only', 'read-write', 'admin'];

const roleSelect = (current, label) =>
  h(
    'select',
    { 'aria-label': label },
    // defaultSelected, so that a form reset comes back to the current role.
    ROLES.map((r) => h('option', { value: r, selected: r === current, defaultSelected: r === current }, r)),
  );

export async function render(main) {
  const slot = h('div', { 'aria-live': 'polite' });
  const list = h('div');

  const username = h('input', { name: 'username', autocomplete: 'off', required: true, maxlength: '255' });
  const password = h('input', {
    name: 'password', type: 'password', autocomplete: 'new-password', required: true, minlength: '8',
  });
  const email = h('input', { name: 'email', type: 'email', autocomplete: 'off' });
  const role = roleSelect('read-write');
  role.removeAttribute('aria-label');
  const createSlot = h('div', { 'aria-live': 'polite' });
  const submit = h('button', { class: 'primary' }, 'Create user');
  const form = h(
    'form',
    {
      class: 'grid-form',
      onsubmit: (e) => {
        e.preventDefault();
        busy(submit, createSlot, async () => {
          const body = { username: username.value, password: password.value, role: role.value };
          if (email.value.trim()) body.email = email.value.trim();
          const user = await api.post('users', body);
          form.reset();
          success(createSlot, `Created ${user.username} (${user.role}).`);
          await load();
        });
      },
    },
    field('User name', username).wrap,
    field('Password', password, 'At least 8 characters.').wrap,
    field('Role', role).wrap,
    field('Email (optional)', email).wrap,
    h('div', { class: 'field end' }, submit),
  );

  main.append(section('Users', slot, list), section('Create a user', form, createSlot));

  async function act(btn, fn, done) {
    await busy(btn, slot, async () => {
      await fn();
      success(slot, done);
      announce(done);
      await load();
    });
  }

  async function load() {
    try {
      const users = await api.get('users');
      const me = api.currentUser();
      list.replaceChildren(
        table(
          'All users',
          [
            { label: 'User name', cell: (u) => [u.username, u.username === me.username ? ' (you)' : ''] },
            { label: 'Email', cell: (u) => u.email || '—' },
            {
              label: 'Role',
              cell: (u) => {
                const sel = roleSelect(u.role, `Role of ${u.username}`);
                const save = button('Save role', () =>
                  act(save, () => api.put(`users/${encodeURIComponent(u.username)}`, { role: sel.value }),
                    `${u.username} is now ${sel.value}.`),
                'secondary small', { 'aria-label': `Save the role of ${u.username}` });
                return h('div', { class: 'inline' }, sel, save);
              },
            },
            { label: 'Created', cell: (u) => timeEl(u.created_at) },
            { label: 'Last sign-in', cell: (u) => timeEl(u.last_login, true) },
            {
              label: 'Devices',
              // null: never seen; absent: the server does not report presence with users.
              cell: (u) => (u.presence === undefined ? '—' : String(u.presence ? u.presence.clientCount : 0)),
              class: 'num',
            },
            {
              label: 'Actions',
              cell: (u) => {
                const reset = button('Reset password', async () => {
                  const pw = await passwordDialog(`New password for ${u.username}`, 'New password');
                  if (pw === null) return;
                  await act(reset, () => api.post('users/reset-password', { username: u.username, new_password: pw }),
                    `Password of ${u.username} reset.`);
                }, 'secondary small', { 'aria-label': `Reset the password of ${u.username}` });
                const remove = button('Delete', async () => {
                  const ok = await confirmDialog(
                    `Delete ${u.username}?`,
                    'The account and its sessions go; the observations it pushed stay.',
                    'Delete user',
                    true,
                  );
                  if (!ok) return;
                  await act(remove, () => api.del(`users/${encodeURIComponent(u.username)}`), `Deleted ${u.username}.`);
                }, 'danger small', { 'aria-label': `Delete ${u.username}` });
                return h('div', { class: 'inline' }, reset, remove);
              },
            },
          ],
          users,
        ),
      );
    } catch (err) {
      showError(slot, err);
    }
  }
  await load();
}

export async function renderAccount(main) {
  const me = await api.get('auth/me');
  const u = me.data;
  const current = h('input', { type: 'password', autocomplete: 'current-password', required: true });
  const next = h('input', { type: 'password', autocomplete: 'new-password', required: true, minlength: '8' });
  const slot = h('div', { 'aria-live': 'polite' });
  const submit = h('button', { class: 'primary' }, 'Change password');
  main.append(
    section(
      'My account',
      h(
        'dl',
        { class: 'stats' },
        h('div', { class: 'stat' }, h('dt', {}, 'User name'), h('dd', {}, u.username)),
        h('div', { class: 'stat' }, h('dt', {}, 'Role'), h('dd', {}, u.role)),
        h('div', { class: 'stat' }, h('dt', {}, 'Email'), h('dd', {}, u.email || '—')),
        h('div', { class: 'stat' }, h('dt', {}, 'Last sign-in'), h('dd', {}, timeEl(u.last_login))),
      ),
    ),
    section(
      'Change password',
      h(
        'form',
        {
          class: 'grid-form',
          onsubmit: (e) => {
            e.preventDefault();
            busy(submit, slot, async () => {
              await api.post('users/change-password', { current_password: current.value, new_password: next.value });
              // The server has revoked every token of this user: sign in again with the new password.
              api.forget('Password changed; please sign in with the new password.');
            });
          },
        },
        field('Current password', current).wrap,
        field('New password', next, 'At least 8 characters.').wrap,
        h('div', { class: 'field end' }, submit),
      ),
      slot,
    ),
  );
}
