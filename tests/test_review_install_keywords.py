"""Review: ``install(how=..., KEYWORD=...)`` gives the same field twice; ``keyword_forms`` refuses that only
where the keyword's value differs from the field's default, so an explicit ``check_every=1`` (the default)
beside ``how=InstallOptions(check_every=32)`` is silently dropped: the program asked for every step and
gets 1 in 32. ``**keywords`` holds exactly what the caller wrote, so presence can be refused, not value."""

from __future__ import annotations

import pytest

from torchgen_patch.runtime.install import InstallOptions, keyword_forms
from torchgen_patch.sources import Options


@pytest.mark.xfail(strict=True,
                   reason="on main: _merged refuses only keywords that differ from the defaults")
@pytest.mark.parametrize("given", [
    dict(how=InstallOptions(check_saved="warn", check_every=32), keywords={"check_every": 1}),
    dict(options=Options(tags="tags.yaml"), keywords={"tags": None}),
])
def test_a_field_given_in_both_forms_is_refused_even_at_its_default(given):
    with pytest.raises(TypeError, match="not both"):
        keyword_forms(given.get("options"), given.get("how"), given["keywords"])
