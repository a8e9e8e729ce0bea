"""Export heads in the layouts serving engines load, validated; import existing drafters.

export_job(job, target, head_dir) -> list[Path]        the job's export stage (train/run.py)
export_head(head, layout, out_dir, meta, target)       one validated export directory
import_head(path, format_name, target, kind=None)      an engine-format drafter as our head
python -m heads.export --help                          the same from the command line
"""

from heads.export.card import DrafterMeta
from heads.export.formats import LAYOUTS, formats_for, layout_for
from heads.export.importer import import_head, import_to_head_dir
from heads.export.job import export_head, export_job
from heads.export.layer_ids import from_engine_layer_ids, to_engine_layer_ids
from heads.export.layouts import TargetWeights

__all__ = [
    "LAYOUTS",
    "DrafterMeta",
    "TargetWeights",
    "export_head",
    "export_job",
    "formats_for",
    "from_engine_layer_ids",
    "import_head",
    "import_to_head_dir",
    "layout_for",
    "to_engine_layer_ids",
]
