// Runs once when the cards' HTML mounts (after assets/board_view.js, whose `trigger` it uses); listens
// on it for clicks on what every redraw puts there.
const pin = (tok, tries = 40) => {  // the First canvas section draws its boxes when first opened: open it, then pin
  const box = document.querySelector('#pins textarea');
  if (!box && tries === 40) document.querySelector('#first-canvas > .label-wrap')?.click();
  if (!box) return tries && setTimeout(() => pin(tok, tries - 1), 50);
  const key = tok.dataset.pos + '=';
  const lines = box.value.split('\n').filter((l) => l.trim() && !l.startsWith(key));
  lines.push(key + tok.dataset.piece);
  box.value = lines.join('\n');
  box.dispatchEvent(new Event('input', {bubbles: true}));
  tok.classList.add('pinned');
};
element.addEventListener('click', (e) => {
  const refine = e.target.closest('button.refine');
  if (refine) {  // the card names its row; the server holds the run of this view; its run shows on Generate
    if (element.closest('#compare')) document.querySelector('#generate-button')?.click();
    trigger('refine', {request: Number(refine.dataset.request)});
    return;
  }
  const tok = e.target.closest('.ctok[data-pos]');
  if (tok) pin(tok);
});
