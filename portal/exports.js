// Exports (docs/api.md §13, §17.7, §17.8): streamed downloads of every format, and export jobs for the
// long ones, polled with a progress bar until their file is ready.
import * as api from './api.js';
import { h, section, field, showError, busy, progress, fmtBytes, fmtNum, saveBlob, button, timeEl, announce } from './ui.js';

const FORMATS = [
  { id: 'parquet', label: 'Parquet (ZIP, one file per form type)', path: 'data/export', job: true },
  { id: 'csv', label: 'CSV (ZIP, one file per form type)', path: 'data/export', job: true },
  { id: 'json', label: 'JSON lines (NDJSON)', path: 'data/export', job: true },
  { id: 'raw-json', label: 'Raw JSON (ZIP, one file per record)', path: 'dataexport/raw-json', job: false },
  { id: 'attachments', label: 'Attachments (ZIP of every file)', path: 'attachments/export-zip', job: false },
];

// Jobs started in this tab survive a visit to another page.
const jobs = new Map();

export async function render(main) {
  const formatBox = h(
    'fieldset',
    { class: 'formats' },
    h('legend', {}, 'Format'),
    FORMATS.map((f, i) =>
      h('div', { class: 'field check' },
        h('input', { type: 'radio', name: 'format', id: `format-${f.id}`, value: f.id, checked: i === 0 }),
        h('label', { for: `format-${f.id}` }, f.label)),
    ),
  );
  const formTypes = h('input', { id: 'export-form-types', autocomplete: 'off' });
  const since = h('input', { id: 'export-since', type: 'number', min: '0', inputmode: 'numeric' });
  const deleted = h('input', { type: 'checkbox', id: 'export-deleted', checked: true });
  const slot = h('div', { 'aria-live': 'polite' });
  const bar = progress('Download progress');
  const runJob = h('button', { type: 'button', class: 'primary', id: 'run-job' }, 'Run as a job');
  const now = h('button', { type: 'button', class: 'secondary', id: 'download-now' }, 'Download now');
  const jobList = h('div', { id: 'jobs' });

  const chosen = () => FORMATS.find((f) => f.id === formatBox.querySelector('input:checked').value);
  const params = () => ({
    form_type: formTypes.value.split(',').map((s) => s.trim()).filter(Boolean),
    since_change_id: since.value.trim(),
    include_deleted: deleted.checked ? 'true' : 'false',
  });
  const sync = () => {
    const f = chosen();
    runJob.disabled = !f.job;
    runJob.title = f.job ? '' : 'This format streams directly; use Download now.';
  };
  formatBox.addEventListener('change', sync);

  now.addEventListener('click', () =>
    busy(now, slot, async () => {
      const f = chosen();
      const query = f.id === 'attachments' ? {} : { ...params(), format: f.path === 'data/export' ? f.id : undefined };
      bar.set(null, 'Starting…');
      try {
        const { blob, filename } = await api.download(f.path, query, (done, total) =>
          bar.set(total ? done / total : null, `${fmtBytes(done)}${total ? ` of ${fmtBytes(total)}` : ''} received`));
        bar.set(1, `Done: ${filename}, ${fmtBytes(blob.size)}.`);
        saveBlob(blob, filename);
        announce(`Downloaded ${filename}`);
      } catch (err) {
        bar.hide();
        throw err;
      }
    }));

  runJob.addEventListener('click', () =>
    busy(runJob, slot, async () => {
      const f = chosen();
      const p = params();
      const body = { format: f.id, include_deleted: p.include_deleted === 'true' };
      if (p.form_type.length) body.form_type = p.form_type;
      if (p.since_change_id) body.since_change_id = p.since_change_id;
      const job = await api.post('dataexport/jobs', body);
      jobs.set(job.job_id, job);
      drawJobs();
      poll(job.job_id);
    }));

  main.append(
    section(
      'Export observations',
      h('form', { class: 'export-form', onsubmit: (e) => e.preventDefault() },
        formatBox,
        h('div', { class: 'filters' },
          field('Form types', formTypes, 'Comma-separated; empty exports every form type.').wrap,
          field('Only changes after', since, 'A change id; empty exports everything.').wrap,
          h('div', { class: 'field check' }, deleted, h('label', { for: 'export-deleted' }, 'Include deleted records'))),
        h('div', { class: 'inline' }, runJob, now)),
      h('p', { class: 'hint' }, 'Jobs run on the server and keep their file for a while: the safe choice for large exports.'),
      bar.el,
      slot,
    ),
    section('Export jobs', jobList),
  );
  sync();

  const timers = new Set();
  function poll(id) {
    const timer = setInterval(async () => {
      try {
        const job = await api.get(`dataexport/jobs/${encodeURIComponent(id)}`);
        jobs.set(id, job);
        if (job.state === 'done' || job.state === 'failed') {
          clearInterval(timer);
          timers.delete(timer);
          announce(`Export job ${job.state}`);
        }
      } catch (err) {
        clearInterval(timer);
        timers.delete(timer);
        jobs.set(id, { ...jobs.get(id), state: 'failed', error: err.message });
      }
      drawJobs();
    }, 700);
    timers.add(timer);
  }

  function drawJobs() {
    if (!jobs.size) {
      jobList.replaceChildren(h('p', { class: 'empty' }, 'No job started in this tab.'));
      return;
    }
    jobList.replaceChildren(
      h('ul', { class: 'jobs' }, [...jobs.values()].reverse().map((job) => {
        const p = progress(`Progress of job ${job.job_id}`);
        const fraction = job.state === 'done' ? 1 : job.rows_total ? job.rows_done / job.rows_total : null;
        p.set(job.state === 'queued' ? 0 : fraction,
          `${job.state}: ${fmtNum(job.rows_done)}${job.rows_total !== null && job.rows_total !== undefined ? ` of ${fmtNum(job.rows_total)}` : ''} rows`);
        const problem = h('div');
        let action = null;
        if (job.state === 'done') {
          action = button('Download', () => busy(action, problem, async () => {
            const { blob, filename } = await api.download(`dataexport/jobs/${encodeURIComponent(job.job_id)}/download`);
            saveBlob(blob, filename);
          }), 'primary', { 'data-job': job.job_id, class: 'primary job-download' });
        }
        return h('li', { class: `job ${job.state}`, 'data-state': job.state },
          h('p', {}, h('strong', {}, job.format), ` job `, h('code', {}, job.job_id), ', started ', timeEl(job.created_at),
            job.change_id ? `, snapshot at change ${job.change_id}` : ''),
          p.el,
          job.error ? h('p', { class: 'error', role: 'alert' }, job.error) : null,
          action,
          problem);
      })),
    );
  }
  drawJobs();
  for (const [id, job] of jobs) if (job.state === 'queued' || job.state === 'running') poll(id);
  return () => timers.forEach(clearInterval);
}
