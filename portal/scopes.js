// Scopes (admin, docs/api.md §20): the scope set in force, the preparation of a new version with
// its progress, an editor of the rules that shows the server's problems next to the fields they
// name, what one user receives under the set in force and the one being prepared, and removal.
import * as api from './api.js';
import {
  h, section, table, timeEl, field, showError, success, button, busy, confirmDialog, progress, fmtNum, badge,
  announce, uid,
} from './ui.js';

const ROLES = ['read-only', 'read-write', 'admin'];
// How often the preparation's progress is asked for while a version is being prepared.
const POLL_MS = 750;

const list = (text) => text.split(',').map((s) => s.trim()).filter(Boolean);
const joined = (items) => (Array.isArray(items) ? items.join(', ') : '');

/** A rule as a sentence-like description list: who, which form types, which records. */
function describeRule(rule) {
  const roles = rule.applies_to?.roles || [];
  const users = rule.applies_to?.users || [];
  const who = [
    roles.length ? `role ${roles.join(', ')}` : null,
    users.length ? `user ${users.join(', ')}` : null,
  ].filter(Boolean).join('; or ');
  const types = rule.form_types === '*' ? 'every form type' : joined(rule.form_types);
  let which = 'all of them';
  if (rule.where && 'in_attribute' in rule.where) {
    which = [
      'those whose ', h('code', {}, rule.where.field), ' is one of the user\'s ', h('code', {}, rule.where.in_attribute),
      ' values',
    ];
  } else if (rule.where && 'equals' in rule.where) {
    which = ['those whose ', h('code', {}, rule.where.field), ' equals ', h('q', {}, rule.where.equals)];
  }
  return h(
    'li',
    { class: 'rule' },
    h('h3', {}, rule.name),
    h(
      'dl',
      {},
      h('div', {}, h('dt', {}, 'Applies to'), h('dd', {}, who || '—')),
      h('div', {}, h('dt', {}, 'Form types'), h('dd', {}, types)),
      h('div', {}, h('dt', {}, 'Records'), h('dd', {}, which)),
    ),
  );
}

/** The readable rendering of a list of rules. */
export function rulesView(rules) {
  if (!rules) return h('p', { class: 'empty' }, 'No scope set: every signed-in user receives every record.');
  if (!rules.length) return h('p', { class: 'empty' }, 'No rule: non-admins receive only the records they created.');
  return h('ol', { class: 'rules' }, rules.map(describeRule));
}

/**
 * Where a problem's path (`/rules/1/where/field`) belongs in the editor: the rule's index and the
 * part of the rule ('name', 'roles', 'users', 'applies_to', 'form_types', 'where', 'field',
 * 'in_attribute', 'equals', or 'rule' for the rest, unknown keys included).
 */
export function locate(path) {
  const m = /^\/rules\/(\d+)(?:\/([^/]+)(?:\/([^/]+))?)?/.exec(path || '');
  if (!m) return null;
  const [, index, key, sub] = m;
  const parts = {
    name: () => 'name',
    applies_to: () => (sub === 'roles' || sub === 'users' ? sub : 'applies_to'),
    form_types: () => 'form_types',
    where: () => (['field', 'in_attribute', 'equals'].includes(sub) ? sub : 'where'),
  };
  return { index: Number(index), part: parts[key] ? parts[key]() : 'rule' };
}

/** One rule's form: its fields, reading back a rule object, showing problems next to its parts. */
function ruleEditor(rule, { attributeNames, formTypes, onRemove, onMove }) {
  const id = uid('rule');
  const problems = {};
  // Each part has a slot for its messages; the inputs it describes point at it (aria-describedby).
  const slotFor = (part, ...inputs) => {
    const slot = h('div', { class: 'field-problems', id: `${id}-${part}-problems`, 'data-part': part });
    problems[part] = { slot, inputs };
    return slot;
  };
  const name = h('input', { class: 'rule-name', value: rule.name || '', autocomplete: 'off', maxlength: '200' });
  const roleBoxes = ROLES.map((role) => h('input', {
    type: 'checkbox', value: role, id: `${id}-role-${role}`, checked: (rule.applies_to?.roles || []).includes(role),
  }));
  const users = h('input', { value: joined(rule.applies_to?.users), autocomplete: 'off' });
  const everyType = h('input', { type: 'radio', name: `${id}-types`, id: `${id}-types-all`, checked: rule.form_types === '*' });
  const someTypes = h('input', { type: 'radio', name: `${id}-types`, id: `${id}-types-some`, checked: rule.form_types !== '*' });
  const types = h('input', {
    value: rule.form_types === '*' ? '' : joined(rule.form_types), autocomplete: 'off', 'aria-label': 'Form types, comma-separated',
  });
  const where = rule.where || {};
  const kind = h(
    'select',
    {},
    h('option', { value: 'none', selected: !rule.where }, 'All records of these types'),
    h('option', { value: 'attribute', selected: 'in_attribute' in where }, 'A field matches a user attribute'),
    h('option', { value: 'equals', selected: 'equals' in where }, 'A field equals a value'),
  );
  const fieldPath = h('input', { value: where.field || '', autocomplete: 'off', placeholder: 'district or address.district' });
  const listId = `${id}-attributes`;
  const attribute = h('input', { value: where.in_attribute || '', autocomplete: 'off', list: listId });
  const equals = h('input', { value: where.equals ?? '', autocomplete: 'off' });

  const fieldWrap = field('Data field', fieldPath, 'A dotted path into the record\'s data.');
  const attributeWrap = field('User attribute', attribute, 'The field must equal one of the user\'s values of it (Users page).');
  const equalsWrap = field('Value', equals);
  const syncVisibility = () => {
    types.disabled = everyType.checked;
    fieldWrap.wrap.hidden = kind.value === 'none';
    attributeWrap.wrap.hidden = kind.value !== 'attribute';
    equalsWrap.wrap.hidden = kind.value !== 'equals';
  };
  for (const el of [everyType, someTypes, kind]) el.addEventListener('change', syncVisibility);

  const position = h('span', {});
  const title = h('span', {}, rule.name || 'new rule');
  const legend = h('legend', {}, position, title);
  name.addEventListener('input', () => {
    title.textContent = name.value || 'new rule';
  });
  const el = h(
    'fieldset',
    { class: 'rule-editor', id },
    legend,
    slotFor('rule'),
    h('div', { class: 'grid-form' }, field('Rule name', name).wrap, slotFor('name', name)),
    h(
      'fieldset',
      { class: 'plain' },
      h('legend', {}, 'Applies to'),
      h('div', { class: 'inline' }, ROLES.map((role, i) => h('span', { class: 'check' },
        roleBoxes[i], h('label', { for: roleBoxes[i].id }, role)))),
      h('small', { class: 'hint' }, 'Users with one of these roles, or named below. Admins receive every record anyway.'),
      slotFor('roles', ...roleBoxes),
      field('Users', users, 'User names, comma-separated.').wrap,
      slotFor('users', users),
      slotFor('applies_to', ...roleBoxes, users),
    ),
    h(
      'fieldset',
      { class: 'plain' },
      h('legend', {}, 'Form types'),
      h('div', { class: 'inline' },
        h('span', { class: 'check' }, everyType, h('label', { for: everyType.id }, 'Every form type')),
        h('span', { class: 'check' }, someTypes, h('label', { for: someTypes.id }, 'Only these:')),
        types),
      formTypes.length ? h('small', { class: 'hint' }, `Form types with records: ${formTypes.join(', ')}.`) : null,
      slotFor('form_types', everyType, someTypes, types),
    ),
    h(
      'div',
      { class: 'grid-form' },
      field('Which records', kind).wrap,
      fieldWrap.wrap,
      attributeWrap.wrap,
      equalsWrap.wrap,
    ),
    h('datalist', { id: listId }, attributeNames.map((n) => h('option', { value: n }))),
    slotFor('where', kind),
    slotFor('field', fieldPath),
    slotFor('in_attribute', attribute),
    slotFor('equals', equals),
    h(
      'div',
      { class: 'inline' },
      button('Move up', () => onMove(-1), 'secondary small', { class: 'secondary small move-up' }),
      button('Move down', () => onMove(1), 'secondary small', { class: 'secondary small move-down' }),
      button('Remove this rule', onRemove, 'danger small'),
    ),
  );
  syncVisibility();

  return {
    el,
    /** The rule as PUT /admin/scopes takes it, from what the fields hold now. */
    read() {
      const appliesTo = {};
      const roles = roleBoxes.filter((b) => b.checked).map((b) => b.value);
      if (roles.length) appliesTo.roles = roles;
      const names = list(users.value);
      if (names.length) appliesTo.users = names;
      const out = { name: name.value, applies_to: appliesTo, form_types: everyType.checked ? '*' : list(types.value) };
      if (kind.value === 'attribute') out.where = { field: fieldPath.value.trim(), in_attribute: attribute.value.trim() };
      if (kind.value === 'equals') out.where = { field: fieldPath.value.trim(), equals: equals.value };
      return out;
    },
    clear() {
      el.classList.remove('invalid');
      for (const { slot, inputs } of Object.values(problems)) {
        slot.replaceChildren();
        for (const input of inputs) input.removeAttribute('aria-invalid');
      }
    },
    /** Shows the server's messages for this rule next to the parts they name. */
    show(part, message) {
      const target = problems[part] || problems.rule;
      el.classList.add('invalid');
      target.slot.append(h('p', { class: 'field-error' }, message));
      for (const input of target.inputs) {
        input.setAttribute('aria-invalid', 'true');
        const described = new Set((input.getAttribute('aria-describedby') || '').split(' ').filter(Boolean));
        described.add(target.slot.id);
        input.setAttribute('aria-describedby', [...described].join(' '));
      }
    },
    setPosition(i) {
      position.textContent = `Rule ${i + 1}: `;
    },
    focusInvalid() {
      const first = el.querySelector('[aria-invalid="true"]');
      (first || name).focus();
    },
  };
}

/** Whether the form can show these rules whole (else they stay in the JSON view). */
function formCanShow(rules) {
  const strings = (v) => v === undefined || (Array.isArray(v) && v.every((s) => typeof s === 'string'));
  if (!Array.isArray(rules)) return 'the rules must be an array';
  for (const [i, r] of rules.entries()) {
    const at = `rule ${i + 1}`;
    if (!r || typeof r !== 'object' || Array.isArray(r)) return `${at} is not an object`;
    const unknown = Object.keys(r).filter((k) => !['name', 'applies_to', 'form_types', 'where'].includes(k));
    if (unknown.length) return `${at} has ${unknown.join(', ')}`;
    if (r.name !== undefined && typeof r.name !== 'string') return `${at}'s name is not text`;
    const a = r.applies_to;
    if (a !== undefined && (typeof a !== 'object' || a === null || Array.isArray(a)
      || Object.keys(a).some((k) => k !== 'roles' && k !== 'users') || !strings(a.roles) || !strings(a.users))) {
      return `${at}'s applies_to`;
    }
    if (!(r.form_types === '*' || r.form_types === undefined || strings(r.form_types))) return `${at}'s form_types`;
    const w = r.where;
    if (w !== undefined && w !== null) {
      const keys = Object.keys(w);
      const ok = typeof w === 'object' && !Array.isArray(w) && typeof w.field === 'string'
        && keys.length === 2 && (typeof w.in_attribute === 'string' || typeof w.equals === 'string');
      if (!ok) return `${at}'s where`;
    }
  }
  return null;
}

/** The rules of `version` from its scope.change audit entry (the API lists only the set in force). */
async function rulesOfPreparing(version) {
  const page = await api.get('admin/audit', { action: 'scope.change', limit: 20 });
  const entry = page.items.find((e) => e.details?.to_version === version);
  return entry ? { found: true, rules: entry.details.rules ?? null } : { found: false, rules: null };
}

export async function render(main, preselectedUser = null) {
  const slot = h('div', { 'aria-live': 'polite' });
  const inForce = h('div', { id: 'scope-in-force' });
  const removeSlot = h('div', { 'aria-live': 'polite' });
  const statusText = h('p', { id: 'scope-status' });
  const stateSlot = h('div', { 'aria-live': 'polite' });
  const bar = progress('Preparation of the new scope set');
  const removeBtn = button('Remove the scope set', () => remove(), 'danger', { id: 'scope-remove' });
  const editorBox = h('div');
  const previewBox = h('div');
  main.append(
    slot,
    section('In force', inForce, h('p', {}, removeBtn), removeSlot),
    section('Preparation', statusText, bar.el, stateSlot),
    section('Edit the rules', editorBox),
    section('What a user receives', previewBox),
  );

  let timer = null;
  let gone = false;
  // Raised by every new watch: an answer to an older poll must not start a second chain.
  let polling = 0;
  let lastStatus = null;
  // A version was stored from this page: say so once it is in force, however fast that was.
  let awaiting = false;
  let hasRules = false;

  const [users, known] = await Promise.all([
    api.get('users'),
    api.get('stats/observations').catch(() => null),
  ]);
  const attributeNames = [...new Set(users.flatMap((u) => Object.keys(u.attributes || {})))].sort();
  const formTypes = (known?.byFormType || []).map((t) => t.formType).sort();

  // Removal means something while a set is in force or one is being prepared.
  const syncRemove = () => {
    removeBtn.hidden = !hasRules && !(lastStatus && lastStatus.preparing_version !== null);
  };

  async function drawInForce() {
    const set = await api.get('admin/scopes');
    if (gone) return;
    hasRules = set.rules !== null;
    inForce.replaceChildren(
      h(
        'dl',
        { class: 'stats' },
        h('div', { class: 'stat' }, h('dt', {}, 'Version'), h('dd', { id: 'scope-version' }, set.version ? String(set.version) : 'none')),
        h('div', { class: 'stat' }, h('dt', {}, 'In force since'), h('dd', {}, timeEl(set.activated_at))),
        h('div', { class: 'stat' }, h('dt', {}, 'Rules'), h('dd', { id: 'scope-rule-count' }, set.rules ? String(set.rules.length) : '—')),
      ),
      rulesView(set.rules),
    );
    syncRemove();
  }

  function drawStatus(st) {
    syncRemove();
    if (st.preparing_version === null) {
      bar.hide();
      statusText.replaceChildren(
        'Nothing is being prepared. ',
        st.active_version ? `Version ${st.active_version} is in force.` : 'No scope set is in force.',
      );
      return;
    }
    const percent = Math.floor(st.progress * 100);
    statusText.replaceChildren(
      badge('preparing', 'warn'),
      ` Version ${st.preparing_version} is being prepared. Until it is ready, `,
      st.active_version ? `version ${st.active_version} stays in force` : 'no scope set applies',
      '; pushes and pulls go on meanwhile.',
    );
    bar.set(st.progress, st.to_scan
      ? `${percent} %: ${fmtNum(st.scanned)} of ${fmtNum(st.to_scan)} records scanned`
      : `${percent} %`);
  }

  /** Asks for the status; while a version is being prepared, asks again until it is in force. */
  async function poll(mine) {
    timer = null;
    let st;
    try {
      st = await api.get('admin/scopes/status');
    } catch (err) {
      if (!gone && mine === polling) showError(stateSlot, err);
      return;
    }
    if (gone || mine !== polling) return;
    const finished = st.preparing_version === null && (awaiting || (lastStatus && lastStatus.preparing_version !== null));
    awaiting = false;
    lastStatus = st;
    drawStatus(st);
    if (finished) {
      await drawInForce();
      if (gone) return;
      const text = st.active_version ? `Version ${st.active_version} is in force.` : 'No scope set is in force.';
      success(stateSlot, text);
      announce(text);
      if (startedFromPreparing !== null && startedFromPreparing === st.active_version) {
        setOrigin(`version ${st.active_version}, in force`);
      }
      refreshPreview();
    }
    if (st.preparing_version !== null) timer = setTimeout(() => poll(mine), POLL_MS);
  }

  /** Follows the preparation from now on (after a save or a removal). */
  function watch(stored) {
    if (timer) clearTimeout(timer);
    timer = null;
    polling += 1;
    awaiting = stored;
    stateSlot.replaceChildren();
    return poll(polling);
  }

  async function remove() {
    const ok = await confirmDialog(
      'Remove the scope set?',
      'Once the change is prepared, every signed-in user receives every record again, on their next sync.',
      'Remove the scope set',
      true,
    );
    if (!ok) return;
    await busy(removeBtn, removeSlot, async () => {
      const res = await api.del('admin/scopes');
      const stored = res.state !== 'active';
      const text = stored
        ? `The removal is stored as version ${res.version} and is being prepared.`
        : 'No scope set was in force or being prepared: nothing changed.';
      success(removeSlot, text);
      announce(text);
      await watch(stored);
      refreshPreview();
    });
  }

  // ---- The editor ----
  const editors = [];
  const rulesList = h('div', { class: 'rule-editors' });
  const summary = h('div', { id: 'scope-problems', 'aria-live': 'polite' });
  const origin = h('p', { class: 'hint' });
  const json = h('textarea', { id: 'scope-json', rows: '18', spellcheck: false, class: 'code-input' });
  const jsonWrap = h('div', { hidden: true }, field('The rules as JSON', json, '{"rules": [...]}: the body of PUT /admin/scopes.').wrap);
  const formMode = h('button', { type: 'button', class: 'secondary small', 'aria-pressed': 'true' }, 'Form');
  const jsonMode = h('button', { type: 'button', class: 'secondary small', 'aria-pressed': 'false' }, 'JSON');
  const add = button('Add a rule', () => {
    addRule({ name: '', applies_to: { roles: ['read-only', 'read-write'] }, form_types: '*' });
    editors[editors.length - 1].el.querySelector('.rule-name').focus();
  }, 'secondary', { id: 'scope-add-rule' });
  const save = h('button', { class: 'primary', id: 'scope-save' }, 'Save the rules');
  const discard = button('Discard changes', () => busy(discard, summary, loadEditor), 'secondary');
  const saveSlot = h('div', { id: 'scope-saved', 'aria-live': 'polite' });

  // The version the editor's rules came from, while it was being prepared.
  let startedFromPreparing = null;
  function setOrigin(from, preparing = null) {
    startedFromPreparing = preparing;
    origin.textContent = `The rules below start from ${from}. Saving stores them as a new version, which takes effect once the server has prepared it.`;
  }

  const inJson = () => !jsonWrap.hidden;
  const readRules = () => editors.map((e) => e.read());

  function drawEditors() {
    rulesList.replaceChildren(
      ...editors.map((e, i) => {
        e.setPosition(i);
        return e.el;
      }),
    );
    if (!editors.length) rulesList.append(h('p', { class: 'empty' }, 'No rule: non-admins would receive only the records they created.'));
    editors.forEach((e, i) => {
      e.el.querySelector('.move-up').disabled = i === 0;
      e.el.querySelector('.move-down').disabled = i === editors.length - 1;
    });
  }

  function addRule(rule) {
    const editor = ruleEditor(rule, {
      attributeNames,
      formTypes,
      onRemove: () => {
        editors.splice(editors.indexOf(editor), 1);
        drawEditors();
        add.focus();
      },
      onMove: (delta) => {
        const i = editors.indexOf(editor);
        editors.splice(i, 1);
        editors.splice(i + delta, 0, editor);
        drawEditors();
        editor.el.querySelector(delta < 0 ? '.move-up' : '.move-down').focus();
      },
    });
    editors.push(editor);
    drawEditors();
  }

  function setRules(rules) {
    editors.splice(0);
    for (const r of rules || []) addRule(r);
    drawEditors();
  }

  function switchMode(toJson) {
    showError(summary, null);
    if (toJson) {
      json.value = JSON.stringify({ rules: readRules() }, null, 2);
    } else {
      let parsed;
      try {
        parsed = JSON.parse(json.value);
      } catch (err) {
        showError(summary, { message: `This is not JSON: ${err.message}` });
        return;
      }
      const rules = parsed && !Array.isArray(parsed) && typeof parsed === 'object' ? parsed.rules : parsed;
      const problem = formCanShow(rules);
      if (problem) {
        showError(summary, { message: `The form cannot show these rules (${problem}): edit them here, or save them to see the server's checks.` });
        return;
      }
      setRules(rules);
    }
    jsonWrap.hidden = !toJson;
    rulesList.hidden = toJson;
    add.hidden = toJson;
    formMode.setAttribute('aria-pressed', String(!toJson));
    jsonMode.setAttribute('aria-pressed', String(toJson));
  }
  formMode.addEventListener('click', () => inJson() && switchMode(false));
  jsonMode.addEventListener('click', () => !inJson() && switchMode(true));

  function showProblems(err) {
    for (const e of editors) e.clear();
    showError(summary, err);
    if (!err || inJson()) return;
    const located = (err.errors || []).map((p) => ({ p, at: locate(p.path) })).filter((x) => x.at && editors[x.at.index]);
    for (const { p, at } of located) editors[at.index].show(at.part, p.message);
    if (located.length) editors[located[0].at.index].focusInvalid();
  }

  async function loadEditor() {
    showProblems(null);
    saveSlot.replaceChildren();
    let start = null;
    const st = lastStatus;
    if (st && st.preparing_version !== null) {
      const preparing = await rulesOfPreparing(st.preparing_version);
      if (preparing.found) {
        start = { rules: preparing.rules, from: `version ${st.preparing_version}, being prepared`, preparing: st.preparing_version };
      }
    }
    if (!start) {
      const set = await api.get('admin/scopes');
      start = { rules: set.rules, from: set.version ? `version ${set.version}, in force` : 'no scope set' };
    }
    setOrigin(start.from, start.preparing ?? null);
    setRules(start.rules || []);
    if (inJson()) json.value = JSON.stringify({ rules: readRules() }, null, 2);
  }

  const editorForm = h(
    'form',
    {
      id: 'scope-editor',
      onsubmit: (e) => {
        e.preventDefault();
        let body;
        if (inJson()) {
          try {
            body = JSON.parse(json.value);
          } catch (err) {
            showError(summary, { message: `This is not JSON: ${err.message}` });
            json.focus();
            return;
          }
        } else {
          body = { rules: readRules() };
        }
        saveSlot.replaceChildren();
        busy(save, null, async () => {
          if (Array.isArray(body?.rules) && body.rules.length === 0) {
            const ok = await confirmDialog(
              'Save a set with no rule?',
              'Non-admins would then receive only the records they created. To give every user every record again, remove the scope set instead.',
              'Save with no rule',
              true,
            );
            if (!ok) return;
          }
          try {
            const res = await api.put('admin/scopes', body);
            showProblems(null);
            const text = `Saved as version ${res.version}; it takes effect once prepared${res.replaced_version ? ` (it replaces version ${res.replaced_version}, which was still being prepared)` : ''}.`;
            success(saveSlot, text);
            announce(text);
            setOrigin(`version ${res.version}, being prepared`, res.version);
            await watch(true);
            refreshPreview();
          } catch (err) {
            if (err.status !== 400) throw err;
            showProblems(err);
            announce(`The rules were not saved: ${err.errors.length || 1} problem(s).`);
          }
        }).catch((err) => showError(summary, err));
      },
    },
    origin,
    h('div', { class: 'inline mode', role: 'group', 'aria-label': 'Edit as' }, h('span', {}, 'Edit as:'), formMode, jsonMode),
    summary,
    rulesList,
    jsonWrap,
    h('div', { class: 'inline actions-row' }, add, save, discard),
    saveSlot,
  );
  editorBox.append(editorForm);

  // ---- The preview ----
  const who = h(
    'select',
    { id: 'preview-user' },
    users.map((u) => h('option', { value: u.username, selected: u.username === preselectedUser }, `${u.username} (${u.role})`)),
  );
  const previewOut = h('div', { id: 'preview-result', 'aria-live': 'polite' });
  const previewBtn = h('button', { class: 'primary' }, 'Preview');
  let previewed = null;
  let previewGeneration = 0;

  function setView(title, p, note) {
    const counts = Object.entries(p.counts).map(([formType, count]) => ({ formType, count }));
    return h(
      'div',
      { class: 'preview-set', 'data-version': String(p.version) },
      h('h3', {}, title),
      note ? h('p', { class: 'hint' }, note) : null,
      p.everything
        ? h('p', {}, badge('everything', 'ok'), ' Receives every record.')
        : h('p', {}, p.rules.length ? ['Rules that apply: ', h('span', { class: 'rule-names' }, p.rules.join(', ')), '.'] : 'No rule applies: only the records they created.'),
      table(`Records received per form type, version ${p.version}`, [
        { label: 'Form type', cell: (r) => r.formType },
        { label: 'Records', cell: (r) => fmtNum(r.count), class: 'num' },
      ], counts, { empty: 'No record.' }),
      h('p', { class: 'total' }, h('strong', {}, `${fmtNum(p.total)} records`), ' in all.'),
    );
  }

  async function runPreview(username) {
    const mine = ++previewGeneration;
    const p = await api.get('admin/scopes/preview', { user: username });
    if (mine !== previewGeneration || gone) return;
    previewed = username;
    const user = users.find((u) => u.username === username);
    const attrs = Object.entries(user?.attributes || {});
    const why = p.role === 'admin' ? 'Admins receive every record.' : null;
    previewOut.replaceChildren(
      h('p', {}, h('strong', {}, p.user), ` (${p.role})`, attrs.length ? ['; attributes: ', attributesText(attrs)] : '; no attributes.'),
      h(
        'div',
        { class: 'cols' },
        setView(p.active.version ? `In force: version ${p.active.version}` : 'In force: no scope set', p.active, why),
        p.preparing
          ? setView(`Being prepared: version ${p.preparing.version}`, p.preparing,
            p.preparing.complete ? null : 'Counts may still grow until the preparation is done.')
          : null,
      ),
    );
  }

  function refreshPreview() {
    if (previewed && !gone) runPreview(previewed).catch((err) => showError(previewOut, err));
  }

  previewBox.append(
    h('p', { class: 'hint' }, 'What one user\'s devices receive under the set in force and, while one is being prepared, under the new one: look before and after saving.'),
    h(
      'form',
      {
        class: 'filters',
        onsubmit: (e) => {
          e.preventDefault();
          busy(previewBtn, previewOut, () => runPreview(who.value));
        },
      },
      field('User', who).wrap,
      previewBtn,
    ),
    previewOut,
  );

  await poll(polling);
  await drawInForce();
  await loadEditor();
  if (preselectedUser) await runPreview(preselectedUser).catch((err) => showError(previewOut, err));
  return () => {
    gone = true;
    if (timer) clearTimeout(timer);
  };
}

/** `district: north, east; team: t7` */
export function attributesText(entries) {
  return entries.map(([name, values]) => `${name}: ${values.join(', ')}`).join('; ');
}

/** #/scopes/{username}: the page with that user's preview open. */
export const renderFor = (main, username) => render(main, username);
