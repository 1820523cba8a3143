// The note of an upload under way (gr.HTML's js_on_load: `element` is the note). The size comes from the file chosen or
// dropped (Gradio's bar knows only the percentage); the bar is polled: Gradio changes it without a mutation to wait for.
const note = element.querySelector('.upload-note');
const area = () => document.querySelector('#load-run');
let picked = null, phase = '', since = 0, toasts = 0;
// A size in the unit of the file's own size (MB from 0.1 MB, else KB), so that both read alike.
const mb = (b, of = b) => of >= 1e5 ? `${(b / 1e6).toFixed(1)} MB` : `${(b / 1e3).toFixed(0)} KB`;
const say = text => { if (note.textContent !== text) note.textContent = text; };
const remember = files => { if (files && files[0]) picked = {name: files[0].name, size: files[0].size}; };
document.addEventListener('change', e => { if (area()?.contains(e.target) && e.target.files) remember(e.target.files); }, true);
document.addEventListener('drop', e => { if (area()?.contains(e.target)) remember(e.dataTransfer?.files); }, true);
setInterval(() => {
  const uploading = area()?.querySelector('.progress-bar');
  const toastCount = document.querySelectorAll('.toast-body').length;
  if (uploading) {
    // Gradio's own bar is a 14 px pie drawn from this variable: the share of the file the server has.
    const share = parseFloat(document.documentElement.style.getPropertyValue('--upload-progress-width')) || 0;
    const pct = Math.max(0, Math.min(100, share));
    const name = picked?.name || area().querySelector('.file-name')?.textContent || 'the file';
    const of = picked ? `${mb(pct / 100 * picked.size, picked.size)} of ${mb(picked.size)} ` : '';
    say(`Uploading ${name}: ${of}(${Math.floor(pct)} %)`);
    if (phase !== 'up') toasts = toastCount;
    phase = 'up';
  } else if (phase === 'up') {
    // The bar is gone: uploaded (the run is being read), or refused (an error says why).
    phase = 'read';
    since = Date.now();
    say(`Uploaded ${picked?.name || 'the file'}${picked ? ` (${mb(picked.size)})` : ''}; reading the run ...`);
  } else if (phase === 'read' && (toastCount > toasts
                                  || (Date.now() - since > 300 && area()?.querySelector('.upload-container')))) {
    // Read and shown, or refused: the upload area is empty again (or an error said why).
    phase = '';
    picked = null;
    say('');
  }
}, 100);
note.dataset.ready = 'yes';  // listening: a file picked from now on is named with its size
