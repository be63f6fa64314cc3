"""``install(how=..., KEYWORD=...)`` gives the same field twice: refused (TypeError), a keyword at its
field's default too (an explicit ``check_every=1`` beside ``how=InstallOptions(check_every=32)`` would be
dropped without a word); ``**keywords`` holds exactly what the caller wrote, so presence is refused."""

from __future__ import annotations

import pytest

from torchgen_patch.runtime.install import InstallOptions, keyword_forms
from torchgen_patch.sources import Options


@pytest.mark.parametrize("given", [
    dict(how=InstallOptions(check_saved="warn", check_every=32), keywords={"check_every": 1}),
    dict(options=Options(tags="tags.yaml"), keywords={"tags": None}),
])
def test_a_field_given_in_both_forms_is_refused_even_at_its_default(given):
    with pytest.raises(TypeError, match="not both"):
        keyword_forms(given.get("options"), given.get("how"), given["keywords"])
