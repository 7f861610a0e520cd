from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('groups', '0008_group_pause'),
    ]

    operations = [
        migrations.AddField(
            model_name='installation',
            name='generation',
            field=models.BigIntegerField(default=1, editable=False),
        ),
    ]
