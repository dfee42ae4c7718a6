// Users (admin): list, create, change role, reset password, set attributes, delete (docs/api.md §7,
// §20.1). And the signed-in user's own account page (change password), open to every role.
import * as api from './api.js';
import {
  h, section, table, timeEl, field, showError, success, button, busy, confirmDialog, passwordDialog, announce, uid,
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
            {
              label: 'Attributes',
              cell: (u) => {
                const edit = button('Edit', async () => {
                  const saved = await attributesDialog(u);
                  if (!saved) return;
                  const done = `Attributes of ${u.username} saved.`;
                  success(slot, done);
                  announce(done);
                  await load();
                }, 'secondary small', { 'aria-label': `Edit the attributes of ${u.username}` });
                return h('div', { class: 'attributes' }, attributesList(u.attributes), edit);
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
                const preview = h('a', { href: `#/scopes/${encodeURIComponent(u.username)}`, class: 'button secondary small',
                  'aria-label': `What ${u.username} receives` }, 'What they receive');
                return h('div', { class: 'inline' }, reset, preview, remove);
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

/** A user's attributes as a description list (`district`: north, east), or a dash. */
function attributesList(attributes) {
  const entries = Object.entries(attributes || {});
  if (!entries.length) return h('span', { class: 'empty' }, 'none');
  return h('dl', { class: 'attribute-list' }, entries.map(([name, values]) =>
    h('div', {}, h('dt', {}, name), h('dd', {}, values.join(', ')))));
}

/**
 * Where a problem's path (`/attributes/district/1`, RFC 6901) points: the attribute's name and,
 * for one value, its index.
 */
export function attributeAt(path) {
  const m = /^\/attributes\/([^/]*)(?:\/(\d+))?$/.exec(path || '');
  if (!m) return null;
  return { name: m[1].replace(/~1/g, '/').replace(/~0/g, '~'), value: m[2] === undefined ? null : Number(m[2]) };
}

/**
 * Edits one user's attributes (name → values, one value per line) in a modal; saves them with
 * PUT /users/{username} and shows the API's problems next to the attributes they name. Resolves
 * to true once saved, false when cancelled.
 */
function attributesDialog(user) {
  return new Promise((resolve) => {
    const rows = [];
    const rowsBox = h('div', { class: 'attribute-rows' });
    const summary = h('div', { 'aria-live': 'polite' });
    // The only submit button: Enter in a field saves.
    const save = h('button', { class: 'primary' }, 'Save attributes');
    const addRow = (name = '', values = []) => {
      const id = uid('attr');
      const nameInput = h('input', { value: name, autocomplete: 'off', maxlength: '64', class: 'attribute-name' });
      const valuesInput = h('textarea', { rows: String(Math.max(2, Math.min(values.length, 6))), class: 'attribute-values' });
      valuesInput.value = values.join('\n');
      const problems = h('div', { class: 'field-problems', id: `${id}-problems` });
      const row = {
        name: nameInput,
        values: valuesInput,
        problems,
        el: null,
        readValues: () => valuesInput.value.split('\n').map((v) => v.trim()).filter(Boolean),
      };
      const remove = button('Remove', () => {
        rows.splice(rows.indexOf(row), 1);
        row.el.remove();
        add.focus();
      }, 'secondary small', { 'aria-label': `Remove the attribute ${name || 'row'}` });
      row.el = h('fieldset', { class: 'attribute-row', id },
        h('legend', { class: 'visually-hidden' }, `Attribute ${rows.length + 1}`),
        field('Name', nameInput).wrap,
        field('Values', valuesInput, 'One per line.').wrap,
        h('div', { class: 'field end' }, remove),
        problems);
      rows.push(row);
      rowsBox.append(row.el);
      return row;
    };
    const add = button('Add an attribute', () => addRow().name.focus(), 'secondary small');
    for (const [name, values] of Object.entries(user.attributes || {})) addRow(name, values);
    if (!rows.length) addRow();

    const clear = () => {
      showError(summary, null);
      for (const row of rows) {
        row.problems.replaceChildren();
        for (const input of [row.name, row.values]) input.removeAttribute('aria-invalid');
      }
    };
    const mark = (row, message) => {
      row.problems.append(h('p', { class: 'field-error' }, message));
      for (const input of [row.name, row.values]) {
        input.setAttribute('aria-invalid', 'true');
        const described = new Set((input.getAttribute('aria-describedby') || '').split(' ').filter(Boolean));
        described.add(row.problems.id);
        input.setAttribute('aria-describedby', [...described].join(' '));
      }
    };

    const dialog = h(
      'dialog',
      { class: 'dialog wide', 'aria-labelledby': 'attributes-title' },
      h(
        'form',
        {
          onsubmit: async (e) => {
            e.preventDefault();
            clear();
            // Rows without a name or values are left out; a name given twice is ambiguous here.
            const used = rows.filter((r) => r.name.value.trim() || r.readValues().length);
            const seen = new Map();
            let twice = false;
            for (const row of used) {
              const name = row.name.value.trim();
              if (seen.has(name)) {
                mark(row, `The attribute '${name}' is listed twice: merge its values into one row.`);
                twice = true;
              }
              seen.set(name, row);
            }
            if (twice) {
              showError(summary, { message: 'Each attribute name may appear once.' });
              return;
            }
            const attributes = Object.fromEntries(used.map((r) => [r.name.value.trim(), r.readValues()]));
            save.disabled = true;
            try {
              await api.put(`users/${encodeURIComponent(user.username)}`, { attributes });
              dialog.close('saved');
            } catch (err) {
              showError(summary, err);
              let first = null;
              for (const problem of err.errors || []) {
                const at = attributeAt(problem.path);
                const row = at && seen.get(at.name);
                if (!row) continue;
                mark(row, at.value === null ? problem.message : `Value ${at.value + 1}: ${problem.message}`);
                first = first || row;
              }
              if (first) first.name.focus();
            } finally {
              save.disabled = false;
            }
          },
        },
        h('h2', { id: 'attributes-title' }, `Attributes of ${user.username}`),
        h('p', { class: 'hint' }, 'Scope rules compare record fields with these values (Scopes page). Saving replaces all of them; the user\'s next sync follows.'),
        summary,
        rowsBox,
        add,
        h(
          'div',
          { class: 'actions' },
          button('Cancel', () => dialog.close('cancel')),
          save,
        ),
      ),
    );
    dialog.addEventListener('close', () => {
      resolve(dialog.returnValue === 'saved');
      dialog.remove();
    });
    document.body.append(dialog);
    dialog.showModal();
  });
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
