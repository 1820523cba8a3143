() => {
  // Every element with an id around what the visitor types in, picks or ticks is theirs from then on
  // (window.dgemmaTouched). Once a page: a second run of the page's load events would otherwise forget them.
  if (window.dgemmaTouched) return;
  window.dgemmaTouched = new Set();
  for (const kind of ["input", "change"]) document.addEventListener(kind, (e) => {
    if (!e.isTrusted) return;
    for (let node = e.target; node; node = node.parentElement) if (node.id) window.dgemmaTouched.add(node.id);
  }, true);
}
